"""Each output judged by the metric of its kind (qcli.analyze.kinds): detection on tiny models of
each kind, the `verify.outputs` override and its errors, the sequence and mask metrics, analyze
using the kinds, the drop following the kind, and the `verify.metric` plug-in."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from conftest import parse_model, save, tensor_text, write_npz
from qcli.analyze import analyze
from qcli.analyze.fidelity import Fidelity, OutputFidelity, output_fidelity
from qcli.analyze.figures import MapAccumulator, MaskAccumulator, RegressionAccumulator
from qcli.analyze.gates import Gates
from qcli.analyze.kinds import Kind, OutputKind, output_kinds
from qcli.analyze.metrics import FidelityAccumulator
from qcli.analyze.plugin import CustomScore
from qcli.analyze.sequences import SequenceAccumulator, ctc_collapse
from qcli.analyze.verdict import verdicts
from qcli.config import Config, OutputKindName, Verify
from qcli.errors import ConfigError
from qcli.precision.goal import Goal

RNG = np.random.default_rng(0)
W8x4 = tensor_text("w", RNG.standard_normal((8, 4)).astype(np.float32))
B4 = tensor_text("b", RNG.standard_normal(4).astype(np.float32))

MODELS = {
    "softmax_classes": f"""<ir_version: 8, opset_import: ["" : 17]>
        net (float[N, 8] x) => (float[N, 4] y) <{W8x4}> {{ m = MatMul (x, w)  y = Softmax <axis = -1> (m) }}""",
    "linear_head": f"""<ir_version: 8, opset_import: ["" : 17]>
        net (float[N, 8] x) => (float[N, 4] y) <{W8x4}, {B4}> {{ m = MatMul (x, w)  y = Add (m, b) }}""",
    "written_softmax": f"""<ir_version: 8, opset_import: ["" : 17]>
        net (float[N, 8] x) => (float[N, 4] y) <{W8x4}, int64[1] ax = {{1}}> {{
            m = MatMul (x, w)  e = Exp (m)  s = ReduceSum <keepdims = 1> (e, ax)  y = Div (e, s) }}""",
    "ctc_sequence": f"""<ir_version: 8, opset_import: ["" : 17]>
        net (float[N, T, 8] x) => (float[N, T, 4] y) <{W8x4}> {{ m = MatMul (x, w)  y = Softmax <axis = -1> (m) }}""",
    "tagger": f"""<ir_version: 8, opset_import: ["" : 17]>
        net (float[N, T, 8] x) => (float[N, T, 4] y) <{W8x4}, {B4}> {{ m = MatMul (x, w)  y = Add (m, b) }}""",
    "l2_normalized": f"""<ir_version: 8, opset_import: ["" : 17]>
        net (float[N, 8] x) => (float[N, 4] y) <{W8x4}> {{ m = MatMul (x, w)  y = LpNormalization <p = 2> (m) }}""",
    "divided_by_norm": f"""<ir_version: 8, opset_import: ["" : 17]>
        net (float[N, 8] x) => (float[N, 4] y) <{W8x4}, int64[1] ax = {{1}}, float eps = {{1e-6}}> {{
            m = MatMul (x, w)  n = ReduceL2 <keepdims = 1, axes = [1]> (m)  c = Max (n, eps)  y = Div (m, c) }}""",
    "mean_pooled": f"""<ir_version: 8, opset_import: ["" : 17]>
        net (float[N, T, 8] x) => (float[N, 4] y) <{W8x4}, int64[1] ax = {{1}}> {{
            m = MatMul (x, w)  y = ReduceMean <keepdims = 0, axes = [1]> (m) }}""",
    "sum_over_count": f"""<ir_version: 8, opset_import: ["" : 17]>
        net (float[N, T, 8] x) => (float[N, 4] y) <{W8x4}, int64[1] ax = {{1}}, float[1] t = {{5.0}}> {{
            m = MatMul (x, w)  s = ReduceSum <keepdims = 0> (m, ax)  y = Div (s, t) }}""",
    "sigmoid_map": """<ir_version: 8, opset_import: ["" : 17]>
        net (float[N, 1, 6, 6] x) => (float[N, 1, 6, 6] y) { y = Sigmoid (x) }""",
    "argmax_ids": f"""<ir_version: 8, opset_import: ["" : 17]>
        net (float[N, 8] x) => (int64[N] y) <{W8x4}> {{ m = MatMul (x, w)  y = ArgMax <axis = 1, keepdims = 0> (m) }}""",
    "feature_map": """<ir_version: 8, opset_import: ["" : 17]>
        net (float[N, 2, 6, 6] x) => (float[N, 2, 6, 6] y) { y = Relu (x) }""",
}
INPUTS = {"ctc_sequence": (4, 5, 8), "tagger": (4, 5, 8), "mean_pooled": (4, 5, 8), "sum_over_count": (4, 5, 8),
          "sigmoid_map": (4, 1, 6, 6), "feature_map": (4, 2, 6, 6)}
EXPECTED = {
    "softmax_classes": (Kind.TOP1, "computed by Softmax"),
    "linear_head": (Kind.TOP1, "a final linear layer with a bias"),
    "written_softmax": (Kind.TOP1, "Exp / ReduceSum (a written-out softmax)"),
    "ctc_sequence": (Kind.SEQUENCE, "computed by Softmax"),
    "tagger": (Kind.SEQUENCE, "a final linear layer with a bias"),
    "l2_normalized": (Kind.COSINE, "normalized by LpNormalization"),
    "divided_by_norm": (Kind.COSINE, "divided by its norm (ReduceL2)"),
    "mean_pooled": (Kind.COSINE, "pooled by ReduceMean"),
    "sum_over_count": (Kind.COSINE, "pooled: ReduceSum divided by a count"),
    "sigmoid_map": (Kind.MASK, "computed by Sigmoid"),
    "argmax_ids": (Kind.PER_ELEMENT, "int64 values"),
    "feature_map": (Kind.COSINE, "[4, 2, 6, 6] float values"),
}


def _kinds(model: onnx.ModelProto, feeds: dict[str, np.ndarray], **kw):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in model.graph.output]
    values = dict(zip(names, ([v] for v in session.run(names, feeds)), strict=True))
    return output_kinds(model, values, **kw)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_each_kind_is_detected_from_the_graph_with_its_reason(name: str) -> None:
    model = parse_model(MODELS[name])
    x = RNG.standard_normal(INPUTS.get(name, (4, 8))).astype(np.float32)
    found = _kinds(model, {"x": x})["y"]
    kind, reason = EXPECTED[name]
    assert found.kind is kind and reason in found.reason, found


def test_the_kind_names_of_the_schema_are_the_kinds() -> None:
    assert set(OutputKindName.__args__) == {k.value for k in Kind}


def test_unit_norm_rows_are_an_embedding_and_a_mask_has_its_threshold() -> None:
    model = parse_model("""<ir_version: 8, opset_import: ["" : 17]>
        net (float[N, 4] x, float[N, 1, 3, 3] p) => (float[N, 4] e, float[N, 1, 3, 3] m) { e = Relu (x)  m = Relu (p) }""")
    rows = np.abs(RNG.standard_normal((6, 4))).astype(np.float32)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    kinds = _kinds(model, {"x": rows, "p": RNG.random((6, 1, 3, 3)).astype(np.float32)}, named={"m": "mask"})
    assert kinds["e"].kind is Kind.COSINE and kinds["e"].reason == "[6, 4] rows of unit norm: an embedding"
    assert kinds["m"].kind is Kind.MASK and kinds["m"].threshold == 0.5
    assert kinds["m"].reason == "verify.outputs says mask; masks thresholded at 0.5 (probabilities; verify.thresholds sets another)"


def test_a_sigmoid_map_is_thresholded_at_a_half_even_when_it_rounds_above_one() -> None:
    """PaddleOCR's text detector: on 1 of 7 batches of pages onnxruntime's Sigmoid gave 1.0000001,
    the map was taken for logits and thresholded at 0, so near-zero background decided the mask
    agreement (0.97 instead of 0.995)."""
    model = parse_model(MODELS["sigmoid_map"])
    x = np.full((2, 1, 6, 6), 40.0, np.float32)
    x[0, 0, 0, :] = -3.0
    values = [ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]]
    values[0][1, 0, 0, 0] = np.float32(1.0000001)
    found = output_kinds(model, {"y": values})["y"]
    assert found.kind is Kind.MASK and found.threshold == 0.5


MULTI_LABEL = f"""<ir_version: 8, opset_import: ["" : 17]>
    net (float[N, 8] x) => (float[N, 4] y) <{W8x4}> {{ m = MatMul (x, w)  y = Sigmoid (m) }}"""


def test_independent_sigmoids_are_labels_not_one_class() -> None:
    """A multi-label head (a pitch CNN's 360 bins, a tagger's labels): one sigmoid per class, so
    judged by the thresholded labels, never by the argmax over classes it does not compete."""
    found = _kinds(parse_model(MULTI_LABEL), {"x": RNG.standard_normal((4, 8)).astype(np.float32)})["y"]
    assert found.kind is Kind.MASK and found.threshold == 0.5
    assert found.reason == ("computed by Sigmoid: [4, 4] independent sigmoids (multi-label scores); masks "
                            "thresholded at 0.5 (probabilities; verify.thresholds sets another)")


def test_a_configured_threshold_is_the_masks_and_is_checked() -> None:
    model = parse_model(MODELS["sigmoid_map"])
    x = {"x": RNG.standard_normal((2, 1, 6, 6)).astype(np.float32)}
    found = _kinds(model, x, thresholds={"y": 0.3})["y"]
    assert found.threshold == 0.3 and found.reason.endswith("; masks thresholded at 0.3 (verify.thresholds)")
    with pytest.raises(ConfigError) as err:
        _kinds(model, x, thresholds={"maps": 0.3})
    assert str(err.value) == "verify.thresholds: the model has no output 'maps'" and err.value.hint == "its outputs: 'y'"
    with pytest.raises(ConfigError) as err:
        _kinds(parse_model(MODELS["softmax_classes"]), {"x": x["x"].reshape(2, 36)[:, :8].copy()}, thresholds={"y": 0.3})
    assert str(err.value) == ("verify.thresholds: output 'y' is judged as top1 (computed by Softmax: [2, 4] class "
                              "scores), not as a mask: a threshold does not apply")
    assert err.value.hint == "add `verify.outputs: {y: mask}` to judge it by thresholded labels, or drop its threshold"
    assert Config.model_validate({"verify": {"thresholds": {"y": -1.5}}}).verify.thresholds == {"y": -1.5}


def test_a_ctc_head_has_its_blank_detected_and_a_configured_one_wins() -> None:
    model = parse_model(MODELS["ctc_sequence"])
    ids = np.array([[0, 1, 0, 0, 2, 0], [0, 0, 3, 0, 0, 0]])  # class 0 wins most positions
    scores = np.eye(4, dtype=np.float32)[ids]  # the float model's values
    values = {"y": [scores]}
    assert output_kinds(model, values)["y"].blank == 0
    assert output_kinds(model, {"y": [scores[..., ::-1].copy()]})["y"].blank == 3
    forced = output_kinds(model, values, blank=2)["y"]
    assert forced.blank == 2 and forced.reason.endswith("; CTC blank 2 (verify.ctc_blank)")
    with pytest.raises(ConfigError) as err:  # the fuzz: an IndexError, exit 3
        output_kinds(model, values, blank=78)
    assert str(err.value) == "verify.ctc_blank: class 78 is not a class of output 'y', whose last axis holds 4 (0-3)"
    assert err.value.hint == "give one of its classes, or drop verify.ctc_blank"
    assert output_kinds(model, values, trim=(78,))["y"].trim == (78,)  # a class it lacks never shows


def test_recurrent_state_outputs_are_ignored() -> None:
    lstm = parse_model(f"""<ir_version: 8, opset_import: ["" : 17]>
        net (float[T, N, 2] x) => (float[T, 1, N, 3] y, float[1, N, 3] h, float[1, N, 3] c)
            <{tensor_text("w", RNG.standard_normal((1, 12, 2)).astype(np.float32))},
             {tensor_text("r", RNG.standard_normal((1, 12, 3)).astype(np.float32))}> {{
            y, h, c = LSTM <hidden_size = 3> (x, w, r) }}""")
    kinds = _kinds(lstm, {"x": RNG.standard_normal((5, 2, 2)).astype(np.float32)})
    assert kinds["h"].kind is kinds["c"].kind is Kind.IGNORE and kinds["y"].kind is Kind.COSINE
    assert kinds["h"].reason == "the Y_h state output of LSTM: a recurrent state, reported but not gated"
    fed_back = parse_model("""<ir_version: 8, opset_import: ["" : 17]>
        net (float[N, 4] x, float[2, N, 8] state) => (float[N, 4] y, float[2, N, 8] stateN) {
            y = Relu (x)  stateN = Tanh (state) }""")
    kinds = _kinds(fed_back, {"x": RNG.standard_normal((3, 4)).astype(np.float32),
                              "state": RNG.standard_normal((2, 3, 8)).astype(np.float32)})
    assert kinds["stateN"].kind is Kind.IGNORE and "'state'" in kinds["stateN"].reason


def test_verify_outputs_is_strict() -> None:
    model = parse_model(MODELS["argmax_ids"])
    x = {"x": RNG.standard_normal((4, 8)).astype(np.float32)}
    with pytest.raises(ConfigError) as err:
        _kinds(model, x, named={"logits": "top1"})
    assert str(err.value) == "verify.outputs: the model has no output 'logits'"
    assert err.value.hint == "its outputs: 'y'"
    with pytest.raises(ConfigError) as err:
        _kinds(model, x, named={"y": "cosine"})
    assert str(err.value) == "verify.outputs: output 'y' holds int64 values: cosine does not apply"
    with pytest.raises(Exception, match="top1"):
        Config.model_validate({"verify": {"outputs": {"y": "argmax"}}})


def test_ctc_collapse_and_the_sequence_metric() -> None:
    assert ctc_collapse(np.array([1, 1, 0, 1, 2, 2, 0, 0]), 0).tolist() == [1, 1, 2]
    assert ctc_collapse(np.array([], dtype=np.int64), 0).tolist() == []
    x = np.eye(3, dtype=np.float32)[[[1, 1, 0, 2], [2, 0, 0, 1], [1, 2, 0, 0]]]  # [N=3, T=4, C=3]
    y = np.eye(3, dtype=np.float32)[[[1, 0, 0, 2], [2, 0, 1, 1], [1, 0, 2, 0]]]
    collapsed = SequenceAccumulator(blank=0)
    collapsed.update(x, y, 3)
    # sample 1: "12" -> "12" (same); sample 2: "21" -> "21" (same: 0,1,1 collapses to 1);
    # sample 3: "12" -> "12" (blank moved); 8 of 12 positions equal
    assert collapsed.agreement == 1.0 and collapsed.position_agreement == pytest.approx(8 / 12)
    raw = SequenceAccumulator()
    raw.update(x, y, 3)
    assert raw.agreement == 0.0 and raw.position_agreement == pytest.approx(8 / 12)
    time_major = SequenceAccumulator(blank=0)  # [T, N, C]: the batch is axis 1
    time_major.update(x.transpose(1, 0, 2), y.transpose(1, 0, 2), 3)
    assert time_major.agreement == 1.0 and time_major.samples == 3
    changed = y.copy()
    changed[2, 3] = np.eye(3)[1]  # "12" -> "121"
    acc = SequenceAccumulator(blank=0)
    acc.update(x, changed, 3)
    assert acc.agreement == pytest.approx(2 / 3)


def test_a_trimmed_class_does_not_count_at_either_end() -> None:
    """PaddleOCR's recognizer on rendered lines: the float model itself hesitates between blank
    and space in a crop's margins, so weight-only int8 "changed" 31 of 208 strings, 28 of them
    by a leading or trailing space (verify.sequence_trim)."""
    space = 3
    ids = np.array([[0, 1, 0, 2, 0, 0], [3, 1, 0, 3, 2, 0], [0, 1, 3, 2, 0, 0]])  # "12", " 1 2", "1 2"
    moved = np.array([[3, 1, 0, 2, 0, 3], [0, 1, 0, 3, 2, 0], [0, 1, 0, 2, 0, 0]])  # " 12 ", "1 2", "12"
    x, y = (np.eye(4, dtype=np.float32)[i] * 0.7 + 0.075 for i in (ids, moved))
    trimmed, plain = SequenceAccumulator(0, (space,)), SequenceAccumulator(0)
    rows = trimmed.update(x, y, 3)
    plain.update(x, y, 3)
    assert plain.agreement == 0.0 and trimmed.agreement == pytest.approx(2 / 3)  # the inner space still counts
    # 4 positions moved, 3 of them blank <-> space in the margins: merged there
    assert plain.position_agreement == pytest.approx(14 / 18) and trimmed.position_agreement == pytest.approx(17 / 18)
    assert rows[0].size == trimmed.decided == 18 + 8  # the positions and the character runs
    model = parse_model(MODELS["ctc_sequence"])
    kind = output_kinds(model, {"y": [x]}, trim=[space])["y"]
    assert kind.trim == (space,) and kind.reason.endswith("; class 3 not counted at either end (verify.sequence_trim)")
    assert Config.model_validate({"verify": {"sequence_trim": [3]}}).verify.sequence_trim == [3]
    with pytest.raises(ValueError, match="greater than or equal to 0"):
        Config.model_validate({"verify": {"sequence_trim": [-1]}})


def test_the_mask_metric_thresholds_both_models() -> None:
    acc = MaskAccumulator(0.5)
    ref = np.array([[[0.9, 0.9], [0.1, 0.1]], [[0.1, 0.1], [0.1, 0.1]]], np.float32)
    got = np.array([[[0.9, 0.4], [0.6, 0.1]], [[0.2, 0.1], [0.1, 0.3]]], np.float32)
    acc.update(ref, got, 2)
    assert acc.agreement == 6 / 8 and acc.iou == pytest.approx((1 / 3 + 1.0) / 2)  # an empty pair agrees


def test_a_sparse_mask_is_gated_on_its_iou_not_on_its_background() -> None:
    """A text detector's map: 4 of 400 pixels on, one lost and one gained. 99.5% of the pixels
    agree (the background), the text's IoU is 3/5: that is the figure the floor reads."""
    ref = np.zeros((1, 1, 20, 20), np.float32)
    ref[0, 0, 5, 5:9] = 0.9
    got = ref.copy()
    got[0, 0, 5, 8], got[0, 0, 6, 5] = 0.1, 0.8
    acc = FidelityAccumulator(output_kinds(parse_model(MODELS["sigmoid_map"].replace("6, 6", "20, 20")),
                                           {"y": [ref]})["y"])
    acc.update(ref, got, 1)
    figures = output_fidelity("y", acc)
    assert figures.mask_agreement == pytest.approx(398 / 400) and figures.mask_iou == pytest.approx(3 / 5)
    assert figures.gated_agreement == pytest.approx(3 / 5) and figures.gated_cosine is None
    fidelity = _fidelity(figures)
    assert fidelity.metric == "mask IoU (y)" and fidelity.drop == pytest.approx(2 / 5)
    assert not Goal(min_top1_agreement=0.99, min_cosine=0.99).accurate(fidelity)


def _fidelity(*outputs: OutputFidelity, custom: CustomScore | None = None) -> Fidelity:
    return Fidelity(outputs, 0.0, custom=custom)


def test_the_drop_follows_the_kind() -> None:
    embedding = OutputFidelity("e", False, None, 0.997, 30.0, kind=Kind.COSINE)
    assert _fidelity(embedding).drop == pytest.approx(0.003) and _fidelity(embedding).metric == "cosine (e)"
    assert _fidelity(embedding).top1_agreement is None  # an embedding is never judged by argmax
    text = OutputFidelity("t", False, None, 0.9999, 40.0, kind=Kind.SEQUENCE, sequence_agreement=0.9,
                          position_agreement=0.995)
    both = _fidelity(embedding, text)
    assert both.drop == pytest.approx(0.1) and both.metric == "sequence agreement (t)"
    assert both.top1_agreement == 0.9 and both.cosine == 0.997
    state = OutputFidelity("h", False, None, 0.5, 3.0, kind=Kind.IGNORE)
    assert _fidelity(embedding, state).drop == pytest.approx(0.003)  # not gated
    goal = Goal(min_top1_agreement=0.99, min_cosine=0.99)
    assert goal.accurate(_fidelity(embedding)) and not goal.accurate(both)
    plugin = CustomScore("verify.metric m:f", 0.8, 0.9, 10)
    assert not goal.accurate(_fidelity(embedding, custom=plugin))
    assert _fidelity(embedding, custom=plugin).drop == pytest.approx(0.1)


def _ctc_model(tmp_path: Path) -> tuple[Path, Path]:
    w = RNG.standard_normal((8, 6)).astype(np.float32) * 2
    b = np.array([9.0, 0, 0, 0, 0, 0], np.float32)  # class 0 (the blank) wins most positions
    model = save(parse_model(f"""<ir_version: 8, opset_import: ["" : 17]>
        net (float[N, T, 8] x) => (float[N, T, 6] y) <{tensor_text("w", w)}, {tensor_text("b", b)}> {{
            m = MatMul (x, w)  a = Add (m, b)  y = Softmax <axis = -1> (a) }}"""), tmp_path / "ctc.onnx")
    data = tmp_path / "data"
    data.mkdir()
    for i in range(24):
        write_npz(data / f"{i:02d}.npz", x=RNG.standard_normal((1, 12, 8)).astype(np.float32))
    return model, data


def test_analyze_judges_each_output_by_its_kind(cli, tmp_path: Path) -> None:
    model, data = _ctc_model(tmp_path)
    q = tmp_path / "q.onnx"
    cli.json("quantize", model, "-o", q, "--data", data, "--no-verify")
    report = analyze(model, q, data, runs=0, layers=False, gates=Gates(max_accuracy_drop=1.0))
    fid = report.fidelity[0]
    assert fid.kind == "sequence" and "CTC blank 0" in fid.reason and fid.top1_agreement is None
    assert fid.sequence_agreement is not None and fid.position_agreement is not None
    assert fid.predicted_agreement is not None  # 12 positions a sample: at most what their agreement predicts
    assert fid.predicted_agreement <= fid.position_agreement ** 12 + 1e-5
    shown = cli("analyze", model, q, "--data", data, "--runs", "0").stdout
    assert f"predicted agreement on unseen samples {fid.predicted_agreement:.4f}" in " ".join(shown.split())
    assert report.gates[0].metric == "1 - sequence agreement (y)"
    assert report.gates[0].value == pytest.approx(1 - fid.sequence_agreement, abs=1e-6)
    as_cosine = analyze(model, q, data, runs=0, layers=False, verify=Verify(outputs={"y": "cosine"}))
    assert as_cosine.fidelity[0].kind == "cosine" and as_cosine.fidelity[0].sequence_agreement is None
    doc = cli.json("analyze", model, q, "--data", data, "--runs", "0")
    assert doc["fidelity"][0]["kind"] == "sequence"


def test_quantize_names_each_kind_and_an_unknown_output_is_exit_2(cli, tmp_path: Path) -> None:
    model, data = _ctc_model(tmp_path)
    doc = cli.json("quantize", model, "-o", tmp_path / "q.onnx", "--data", data, "--no-rescue",
                   "--min-top1-agreement", "0.5")
    v = doc["verification"]
    assert [c["name"] for c in v["checks"]][0] == "sequence agreement" and v["checks"][0]["output"] == "y"
    assert v["outputs"][0]["kind"] == "sequence" and v["outputs"][0]["position_agreement"] is not None
    config = tmp_path / "c.yaml"
    config.write_text("verify: {outputs: {logits: top1}}\n")
    result = cli("quantize", model, "-o", tmp_path / "q2.onnx", "--data", data, "--config", config)
    assert result.exit_code == 2
    assert result.stderr.splitlines()[:2] == ["error: verify.outputs: the model has no output 'logits'",
                                              "hint: its outputs: 'y'"]
    text = cli("quantize", model, "-o", tmp_path / "q3.onnx", "--data", data, "--no-rescue", "--min-top1-agreement", "0.5")
    assert "output 'y': sequence, computed by Softmax" in text.stdout


PLUGIN = '''
import numpy as np

def decoded_same(float_outputs, quantized_outputs, sample):
    """1 when the argmax path is unchanged, else 0; the floor is 0.5."""
    assert set(sample) == {"x"} and sample["x"].shape == (1, 12, 8)
    a, b = float_outputs["y"].argmax(-1), quantized_outputs["y"].argmax(-1)
    return float(np.array_equal(a, b)), 0.5

def impossible(float_outputs, quantized_outputs, sample):
    return 0.0, 1.0
'''


def test_a_user_metric_is_a_plug_in(cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, data = _ctc_model(tmp_path)
    (tmp_path / "mymetrics.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    config = tmp_path / "c.yaml"
    config.write_text("verify: {metric: 'mymetrics:decoded_same', max_latency_ratio: null}\n")
    doc = cli.json("quantize", model, "-o", tmp_path / "q.onnx", "--data", data, "--config", config)
    check = next(c for c in doc["verification"]["checks"] if c["name"] == "verify.metric mymetrics:decoded_same")
    assert check["floor"] == 0.5 and check["passed"] and 0.5 <= check["value"] <= 1.0
    config.write_text("verify: {metric: 'mymetrics:impossible', rescue: false, max_latency_ratio: null}\n")
    missed = cli("quantize", model, "-o", tmp_path / "q2.onnx", "--data", data, "--config", config)
    assert missed.exit_code == 1
    assert "verify.metric mymetrics:impossible 0.0000 misses its floor 1 by 1.0000" in missed.stderr
    config.write_text("verify: {metric: 'nomodule_here:cer'}\n")
    result = cli("quantize", model, "-o", tmp_path / "q3.onnx", "--data", data, "--config", config)
    assert result.exit_code == 2 and result.stderr.splitlines()[0] == (
        "error: verify.metric 'nomodule_here:cer': cannot import 'nomodule_here': "
        "ModuleNotFoundError: No module named 'nomodule_here'")
    config.write_text("verify: {metric: 'mymetrics:missing'}\n")
    result = cli("quantize", model, "-o", tmp_path / "q4.onnx", "--data", data, "--config", config)
    assert result.exit_code == 2
    assert result.stderr.splitlines()[0] == "error: verify.metric 'mymetrics:missing': module 'mymetrics' has no function 'missing'"


def test_an_accumulator_without_a_kind_decides_from_the_values() -> None:
    acc = FidelityAccumulator()
    x = RNG.standard_normal((4, 3)).astype(np.float32)
    acc.update(x, x, 4)
    assert acc.kind is not None and acc.kind.kind is Kind.TOP1 and acc.top1_agreement == 1.0


W8x1 = tensor_text("w", RNG.standard_normal((8, 1)).astype(np.float32))
REGRESSOR = f"""<ir_version: 8, opset_import: ["" : 17]>
    net (float[N, 8] x) => (float[N, 1] y) <{W8x1}, float[1] b = {{3.0}}> {{ m = MatMul (x, w)  y = Add (m, b) }}"""


def test_one_value_per_sample_that_is_no_probability_is_a_regression() -> None:
    """A quality score, an age: its cosine over one number is its sign, its argmax has one class."""
    found = _kinds(parse_model(REGRESSOR), {"x": RNG.standard_normal((6, 8)).astype(np.float32)})["y"]
    assert found.kind is Kind.REGRESSION
    assert found.reason == ("a final linear layer with a bias (Add): one value per sample [6, 1], not a probability: "
                            "a regression")


def test_the_relative_error_is_over_the_outputs_spread() -> None:
    acc = RegressionAccumulator()
    ref = np.array([[1.0, 10.0], [3.0, 30.0], [5.0, 50.0]])  # element 1 spreads 10x element 0
    acc.update(ref, ref + np.array([0.2, 0.0]), 3)
    spread = np.mean([np.var(ref[:, 0]), np.var(ref[:, 1])])
    assert acc.relative_error == pytest.approx(np.sqrt(0.02 / spread))
    constant = RegressionAccumulator()
    constant.update(np.full((4, 1), 2.0), np.full((4, 1), 2.1), 4)  # no spread: relative to its magnitude
    assert constant.relative_error == pytest.approx(0.05)


def test_an_output_without_a_batch_axis_pools_its_spread() -> None:
    """A Flatten to [N * 2, 5] is one row per batch whose length follows the batch: its elements do
    not line up across batches (the fuzzer found the sums failing to broadcast, exit 3)."""
    acc = RegressionAccumulator()
    rng = np.random.default_rng(7)  # not the module's RNG: the tests after it draw from that
    a, b = rng.standard_normal((16, 5)), rng.standard_normal((32, 5))
    acc.update(a, a + 0.1, 8)
    acc.update(b, b + 0.1, 16)
    values = np.concatenate([a.ravel(), b.ravel()])
    assert acc.ragged and acc.relative_error == pytest.approx(0.1 / np.std(values))


@pytest.mark.parametrize(("errors", "passed", "how"), [
    ([0.0064] * 32, True, "clear below the ceiling"),  # relative error 0.08, no spread
    ([0.0, 0.03] * 16, False, "above the ceiling"),  # 0.122
    ([0.0, 0.019] * 16, False, "reaches above the ceiling"),  # 0.097, its interval [0.079, 0.113]
])
def test_a_regression_is_met_only_when_its_error_interval_is_under_the_ceiling(errors, passed: bool, how: str) -> None:
    acc = FidelityAccumulator(OutputKind(Kind.REGRESSION, ""))
    ref = np.tile([1.0, -1.0], 16).reshape(32, 1)  # variance 1: the relative error is the RMS error
    acc.update(ref, ref + np.sqrt(errors).reshape(32, 1), 32)
    figures = output_fidelity("y", acc)
    (v,) = verdicts(_fidelity(figures), 0.99, 0.99, 0.1)
    assert v.metric == "relative error" and v.passed is passed and how in v.how
    assert _fidelity(figures).metric == "unexplained variance (y)"
    assert _fidelity(figures).drop == pytest.approx(figures.relative_error ** 2)


def test_quantize_checks_a_regression_against_its_ceiling(cli, tmp_path: Path) -> None:
    model = save(parse_model(REGRESSOR), tmp_path / "r.onnx")
    data = tmp_path / "data"
    data.mkdir()
    for i in range(48):
        write_npz(data / f"{i:02d}.npz", x=RNG.standard_normal((1, 8)).astype(np.float32))
    doc = cli.json("quantize", model, "-o", tmp_path / "q.onnx", "--data", data)
    (check,) = doc["verification"]["checks"][:1]
    assert check["name"] == "relative error" and check["kind"] == "at_most" and check["floor"] == 0.1
    assert doc["verification"]["outputs"][0]["kind"] == "regression" and check["passed"]
    report = analyze(model, tmp_path / "q.onnx", data, runs=0, layers=False, gates=Gates(max_accuracy_drop=0.01))
    assert report.gates[0].metric == "unexplained variance (y)" and report.gates[0].passed


K3 = tensor_text("k", RNG.standard_normal((1, 2, 3, 3)).astype(np.float32))
SALIENCY = f"""<ir_version: 8, opset_import: ["" : 17]>
    net (float[N, 2, 16, 16] x) => (float[N, 1, 16, 16] y) <{K3}> {{ y = Conv <pads = [1, 1, 1, 1]> (x, k) }}"""


def test_a_one_channel_map_is_judged_by_its_top_region() -> None:
    """A saliency map or a heat-map: where its highest values are is what its users read."""
    model = parse_model(SALIENCY)
    found = _kinds(model, {"x": RNG.standard_normal((3, 2, 16, 16)).astype(np.float32)})["y"]
    assert found.kind is Kind.MAP and found.reason == "a [3, 1, 16, 16] dense map: the IoU of its top tenth"
    probabilities = _kinds(model, {"x": np.zeros((3, 2, 16, 16), np.float32)})["y"]  # all 0: within [0, 1]
    assert probabilities.kind is Kind.MASK


def test_the_top_region_iou_and_psnr() -> None:
    acc = MapAccumulator()
    ref = np.zeros((2, 1, 10, 10), np.float32)
    ref[0, 0, :2, :5] = 5.0  # the top tenth of sample 0: its first 10 elements
    ref[1, 0, 9, :] = 1.0  # of sample 1: its last 10
    got = ref.copy()
    got[0, 0, 0, :5] = 0.0  # half of sample 0's top region lost...
    got[0, 0, 5, :5] = 6.0  # ...to another place
    acc.update(ref, got, 2)
    assert acc.iou == pytest.approx((5 / 15 + 1.0) / 2)
    mse = (5 * 25 + 5 * 36) / 100  # sample 0; sample 1 is exact (left out of the PSNR)
    assert acc.psnr.value == pytest.approx(10 * np.log10(25 / mse))


def test_quantize_checks_a_map_by_its_top_region(cli, tmp_path: Path) -> None:
    model = save(parse_model(SALIENCY), tmp_path / "s.onnx")
    data = tmp_path / "data"
    data.mkdir()
    for i in range(48):
        write_npz(data / f"{i:02d}.npz", x=RNG.standard_normal((1, 2, 16, 16)).astype(np.float32))
    result = cli("quantize", model, "-o", tmp_path / "q.onnx", "--data", data, "--json")
    v = json.loads(result.stdout)["verification"]
    assert v["outputs"][0]["kind"] == "map" and v["outputs"][0]["psnr_db"] > 20
    (check,) = [c for c in v["checks"] if c["name"] == "top-region IoU"]
    assert check["value"] == pytest.approx(v["outputs"][0]["map_iou"], abs=1e-6)  # the check's is rounded
    assert check["passed"] is (result.exit_code == 0) and check["floor"] == 0.95  # verify.min_spatial_agreement


def test_a_few_scores_above_zero_on_every_sample_are_a_regression_not_classes() -> None:
    """A speech-quality model's [N, 3] mean opinion scores (1-5) from a final linear layer:
    argmax over them is no decision anyone makes."""
    w = tensor_text("w", (RNG.standard_normal((8, 3)) * 0.1).astype(np.float32))
    model = parse_model(f"""<ir_version: 8, opset_import: ["" : 17]>
        net (float[N, 8] x) => (float[N, 3] y) <{w}, float[3] b = {{3.5, 4.0, 3.0}}> {{
            m = MatMul (x, w)  y = Add (m, b) }}""")
    found = _kinds(model, {"x": RNG.standard_normal((16, 8)).astype(np.float32)})["y"]
    assert found.kind is Kind.REGRESSION and "values above 0 on every sample" in found.reason
    logits = _kinds(parse_model(MODELS["linear_head"]), {"x": RNG.standard_normal((16, 8)).astype(np.float32)})["y"]
    assert logits.kind is Kind.TOP1  # both signs: logits


def test_class_scores_report_whether_floats_top1_stays_in_the_top_five() -> None:
    acc = FidelityAccumulator(OutputKind(Kind.TOP1, ""))
    ref = np.tile(np.arange(8, dtype=np.float32), (3, 1))  # float's top-1: class 7
    got = ref.copy()
    got[1, 7] = 3.5  # class 7 falls to 5th place: top-1 changed, still in the top 5
    got[2, 7] = -1.0  # last: out of the top 5
    acc.update(ref, got, 3)
    assert acc.top1_agreement == pytest.approx(1 / 3) and acc.top5_agreement == pytest.approx(2 / 3)
    few = FidelityAccumulator(OutputKind(Kind.TOP1, ""))
    few.update(ref[:, :4], ref[:, :4], 3)
    assert few.top5_agreement is None  # 4 classes: every one is in the top 5


SEGMENTATION = """<ir_version: 8, opset_import: ["" : 17]>
    net (float[N, 3, 8, 8] x) => (float[N, {C}, 16, 16] y) <float[{C}, 3, 1, 1] w = {W}, float[4] s = {1.0, 1.0, 2.0, 2.0}> {
        c = Conv (x, w)  y = Resize <mode = "linear"> (c, , s) }"""


def _segmentation(classes: int) -> onnx.ModelProto:
    weights = "{" + ", ".join(f"{v:.3f}" for v in RNG.standard_normal(classes * 3)) + "}"
    return parse_model(SEGMENTATION.replace("{C}", str(classes)).replace("{W}", weights))


def test_upsampled_logits_are_a_class_map_judged_by_the_mean_iou_of_its_classes() -> None:
    """A segmentation head (Conv, then Resize to the input's size): each pixel's class is the
    argmax over the channels; a small class lost costs its whole IoU, where the pixels agreeing
    (the background's) barely move. A detector's raw head (no upsampling) stays cosine."""
    model = _segmentation(3)
    ref = np.zeros((1, 3, 16, 16), np.float32)
    ref[0, 0] = 1.0  # background everywhere
    ref[0, 1, :2, :2] = 2.0  # a 4-pixel object of class 1
    ref[0, 2, 8:, :] = 3.0  # half the image class 2
    got = ref.copy()
    got[0, 1, :2, :2] = 0.0  # the object lost to the background
    kind = output_kinds(model, {"y": [ref]})["y"]
    assert kind.kind is Kind.MASK and kind.classes == 1
    assert kind.reason.startswith("upsampled by Resize: a [1, 3, 16, 16] per-pixel class map (segmentation logits)")
    acc = FidelityAccumulator(kind)
    acc.update(ref, got, 1)
    figures = output_fidelity("y", acc)
    assert figures.mask_agreement == pytest.approx(252 / 256)
    assert figures.mask_iou == pytest.approx((124 / 128 + 0.0 + 1.0) / 3)  # background, class 1, class 2
    raw = parse_model(SEGMENTATION.replace("{C}", "3").replace("{W}", "{" + ", ".join(["0.1"] * 9) + "}")
                      .replace("y = Resize <mode = \"linear\"> (c, , s)", "y = Identity (c)")
                      .replace("16, 16] y", "8, 8] y"))
    assert output_kinds(raw, {"y": [ref[:, :, :8, :8]]})["y"].kind is Kind.COSINE


def test_a_softmax_class_map_is_compared_by_its_argmax_and_takes_no_threshold() -> None:
    model = parse_model("""<ir_version: 8, opset_import: ["" : 17]>
        net (float[N, 4, 6, 6] x) => (float[N, 4, 6, 6] y) { y = Softmax <axis = 1> (x) }""")
    values = RNG.random((2, 4, 6, 6)).astype(np.float32)
    kind = output_kinds(model, {"y": [values]})["y"]
    assert kind.kind is Kind.MASK and kind.classes == 1 and "the argmax over axis 1" in kind.reason
    channels_last = RNG.random((2, 6, 6, 4)).astype(np.float32)
    assert output_kinds(model, {"y": [channels_last]})["y"].classes == 3
    with pytest.raises(ConfigError, match=r"verify.thresholds: output 'y' is computed by Softmax: a \[2, 4, 6, 6\] "
                                          r"per-pixel class map: compared by each pixel's class \(the argmax\), so a "
                                          r"threshold does not apply"):
        output_kinds(model, {"y": [values]}, thresholds={"y": 0.3})


def test_quantize_judges_a_segmentation_head_by_the_mean_iou_of_its_classes(cli, tmp_path: Path) -> None:
    model = save(_segmentation(4), tmp_path / "seg.onnx")
    data = tmp_path / "data"
    data.mkdir()
    write_npz(data / "x.npz", x=RNG.standard_normal((24, 3, 8, 8)).astype(np.float32))
    doc = cli.json("quantize", model, "-o", tmp_path / "q.onnx", "--data", data, "--no-rescue",
                   "--min-spatial-agreement", "0.5")
    v = doc["verification"]
    assert v["checks"][0]["name"] == "mask IoU" and v["checks"][0]["output"] == "y"
    out = v["outputs"][0]
    assert out["kind"] == "mask" and "segmentation logits" in out["reason"] and "mean IoU" in out["reason"]
    assert 0.0 <= out["mask_iou"] <= out["mask_agreement"] <= 1.0


def test_an_output_shaped_unlike_floats_counts_its_samples_as_changed() -> None:
    """A decoding Loop that stops a step later (SLANet's table structure) writes a longer
    sequence: that sample is a changed sequence, its steps in common still compared; a cosine
    output of another length has cosine 0 there; a mask's IoU is 0."""
    steps = np.eye(4, dtype=np.float32)[[[1, 2, 3, 0]]] * 0.9 + 0.025  # "123" then the end 0
    longer = np.eye(4, dtype=np.float32)[[[1, 2, 3, 3, 0]]] * 0.9 + 0.025
    seq = FidelityAccumulator(kind=OutputKind(Kind.SEQUENCE, "class scores per position"))
    seq.update(steps, steps, 1)
    seq.update(steps, longer, 1)
    figures = output_fidelity("y", seq)
    assert (figures.samples, figures.sequence_agreement, seq.reshaped) == (2, 0.5, 1)
    assert figures.position_agreement == pytest.approx(7 / 9)  # 4 + 4 steps alike, 1 only in the longer
    assert figures.cosine == pytest.approx(0.5)
    cos = FidelityAccumulator(kind=OutputKind(Kind.COSINE, "float values"))
    cos.update(np.ones((1, 3, 8)), np.ones((1, 4, 8)), 1)
    assert (output_fidelity("y", cos).cosine, cos.cosine_min) == (0.0, 0.0)
    mask = FidelityAccumulator(kind=OutputKind(Kind.MASK, "probabilities", threshold=0.5))
    mask.update(np.full((1, 6), 0.9), np.full((1, 6), 0.9), 1)
    mask.update(np.full((1, 6), 0.9), np.full((1, 7), 0.9), 1)
    assert output_fidelity("y", mask).mask_iou == pytest.approx(0.5)


def test_a_step_where_float_scores_every_class_alike_decides_nothing() -> None:
    """The steps of a Loop's buffer it never wrote come out of Softmax as 1 / classes each:
    the argmax there is arbitrary and stays, so those steps do not enter the margins'
    prediction (it predicted 0.69 for SLANet-plus against itself: one such step a table)."""
    written = np.eye(5, dtype=np.float32)[[1, 2, 3, 4]] * 0.95 + 0.01
    x = np.concatenate([written, np.full((1, 5), 0.2, np.float32)])[None]  # four steps, then an unwritten one
    y = x + np.float32(1e-7) * np.arange(5, dtype=np.float32)
    acc = FidelityAccumulator(kind=OutputKind(Kind.SEQUENCE, "class scores per position"))
    for _ in range(8):
        acc.update(x, y, 1)
    assert output_fidelity("y", acc).predicted_agreement > 0.999


def test_a_map_is_gated_on_the_spatial_floor_and_a_pooled_probability_on_the_agreement_floor() -> None:
    """verify.min_spatial_agreement (0.95) is the floor of outputs that say where: a text
    detector's map whose mean IoU is 0.97 on 400 pages passes it where 0.99 would fail it; one
    probability per sample (Silero's speech) or a set of labels per sample stays a decision
    gated at min_top1_agreement, and so do boxes' neighbours of other kinds."""
    rng = np.random.default_rng(0)
    ref = (rng.random((400, 1, 8, 8)) > 0.5).astype(np.float32) * 0.9
    got = ref.copy()
    got[:, 0, 0, 0] = 0.9 - got[:, 0, 0, 0]  # one pixel of ~32 "on" flipped a page: IoU ~0.97
    spatial = FidelityAccumulator(kind=OutputKind(Kind.MASK, "a map of probabilities"))
    spatial.update(ref, got, 400)
    figures = output_fidelity("map", spatial)
    assert figures.spatial and 0.95 < figures.mask_iou < 0.99
    (v,) = verdicts(_fidelity(figures), 0.99, 0.99, min_spatial=0.95)
    assert (v.floor, v.passed) == (0.95, True), v
    (v,) = verdicts(_fidelity(figures), 0.99, 0.99)  # min_spatial null: the agreement floor
    assert (v.floor, v.passed) == (0.99, False), v
    for shape in ((64, 1), (64, 264)):  # one probability per sample; labels per sample
        acc = FidelityAccumulator(kind=OutputKind(Kind.MASK, "probabilities"))
        acc.update(np.full(shape, 0.9, np.float32), np.full(shape, 0.9, np.float32), shape[0])
        assert not output_fidelity("p", acc).spatial
        (v,) = verdicts(_fidelity(output_fidelity("p", acc)), 0.99, 0.99, min_spatial=0.95)
        assert v.floor == 0.99
