"""`qcli quantize` end to end: QDQ structure, numerics vs float, fusion, files, bad input."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import onnx
from test_calibrate_cli import CONV_MODEL

from conftest import SAMPLE_MODELS, fused_op_counts, op_counts, parse_model, save
from qcli.runtime import make_session


def _outputs(path: Path, x: np.ndarray) -> np.ndarray:
    return make_session(path).run(None, {"x": x})[0]


def test_residual_block_is_quantized_fused_and_close(cli, residual, residual_data, unfloored, tmp_path) -> None:
    out = tmp_path / "q.onnx"
    doc = cli.json("quantize", residual, "-o", out, "--data", residual_data, "--config", unfloored)
    assert doc["quantized"] == {"Conv": 2, "Add": 1, "Gemm": 1, "GlobalAveragePool": 1, "Flatten": 1}
    assert doc["folded"] == {"Relu": 2}
    assert doc["float"] == []
    counts = op_counts(out)
    # activations x, r1 (Relu folded into c1), c2, r2 (Relu folded into s), p, f: one Q and one
    # DQ each; weights w1, w2, wf and biases b1, bf: one DQ each; the output y comes out of the
    # int8 Gemm in float (no Q/DQ pair: nothing quantized reads it)
    assert counts["QuantizeLinear"] == 6
    assert counts["DequantizeLinear"] == 6 + 5
    fused = fused_op_counts(out, tmp_path)
    assert fused["QLinearConv"] == 2 and fused["QLinearAdd"] == 1 and fused["QGemm"] == 1
    assert fused["Conv"] == 0 and fused["Add"] == 0 and fused["Gemm"] == 0
    assert fused["DequantizeLinear"] == 0

    x = np.random.default_rng(7).standard_normal((16, 4, 8, 8)).astype(np.float32)
    ref, got = _outputs(residual, x), _outputs(out, x)
    cosine = (ref * got).sum() / np.linalg.norm(ref) / np.linalg.norm(got)
    assert cosine > 0.995
    assert np.abs(ref - got).max() < 0.05 * np.abs(ref).max()

    meta = {p.key: p.value for p in onnx.load(str(out)).metadata_props}
    assert meta["qcli.version"]
    assert json.loads(meta["qcli.config"])["activations"] == {"dtype": "uint8", "symmetric": False, "mode": "static"}
    assert json.loads(meta["qcli.calibration"])["method"] == "mse"


def test_output_is_deterministic_and_reproducible_from_the_calibration_file(
    cli, residual, residual_data, unfloored, tmp_path
) -> None:
    a, b, c = tmp_path / "a.onnx", tmp_path / "b.onnx", tmp_path / "c.onnx"
    calib, config = tmp_path / "r.calib.json", ("--config", unfloored)
    assert cli("quantize", residual, "-o", a, "--data", residual_data, *config, "-q").exit_code == 0
    assert cli("quantize", residual, "-o", b, "--data", residual_data, *config, "-q").exit_code == 0
    assert a.read_bytes() == b.read_bytes()
    assert cli("calibrate", residual, "--data", residual_data, "-o", calib, "-q").exit_code == 0
    assert cli("quantize", residual, "-o", c, "--calib", calib, *config, "-q").exit_code == 0
    assert c.read_bytes() == a.read_bytes()
    # switching the method from the stored histograms needs no data and changes the ranges
    d = tmp_path / "d.onnx"
    assert cli("quantize", residual, "-o", d, "--calib", calib, "--method", "minmax", *config, "-q").exit_code == 0
    assert d.read_bytes() != a.read_bytes()


def test_never_overwrites_the_input(cli, residual, residual_data) -> None:
    before = residual.read_bytes()
    result = cli("quantize", residual, "-o", residual, "--data", residual_data)
    assert result.exit_code == 2
    assert f"error: -o {residual} is the input model; qcli never overwrites its input" in result.stderr
    assert residual.read_bytes() == before


def test_data_or_calib_required(cli, residual, tmp_path) -> None:
    result = cli("quantize", residual, "-o", tmp_path / "q.onnx")
    assert result.exit_code == 2
    assert "error: give exactly one of --data DIR (calibrate now) or --calib FILE" in result.stderr


def test_stale_calibration_file(cli, residual, residual_data, tmp_path) -> None:
    calib = tmp_path / "c.json"
    cli("calibrate", residual, "--data", residual_data, "-o", calib, "-q")
    other = save(parse_model(CONV_MODEL), tmp_path / "other.onnx")
    result = cli("quantize", other, "-o", tmp_path / "q.onnx", "--calib", calib)
    assert result.exit_code == 2
    assert f"error: {calib} was made for another model" in result.stderr
    assert not (tmp_path / "q.onnx").exists()


def test_already_quantized_model_refused(cli, residual, residual_data, unfloored, tmp_path) -> None:
    q = tmp_path / "q.onnx"
    assert cli("quantize", residual, "-o", q, "--data", residual_data, "--config", unfloored, "-q").exit_code == 0
    result = cli("quantize", q, "-o", tmp_path / "qq.onnx", "--data", residual_data)
    assert result.exit_code == 2
    assert "already quantized" in result.stderr


def test_a_model_qcli_wrote_in_float_is_quantized_again_with_its_metadata_replaced(cli, residual, residual_data,
                                                                                   unfloored, tmp_path) -> None:
    """Nothing quantized in the first run's model (weights only, folded): a second run with
    another config writes qcli's keys once, with the second run's values (the checker refuses
    duplicate keys: this was exit 3)."""
    first = tmp_path / "c.yaml"
    first.write_text("version: 1\nactivations: {dtype: float}\nverify: {max_latency_ratio: null}\n")
    q, qq = tmp_path / "q.onnx", tmp_path / "qq.onnx"
    assert cli("quantize", residual, "-o", q, "--data", residual_data, "--config", first, "-q").exit_code == 0
    assert not any(n.op_type == "QuantizeLinear" for n in onnx.load(str(q)).graph.node)
    assert cli("quantize", q, "-o", qq, "--data", residual_data, "--config", unfloored, "-q").exit_code == 0
    keys = [p.key for p in onnx.load(str(qq)).metadata_props]
    assert sorted(keys) == sorted(set(keys)) and "qcli.config" in keys
    config = json.loads(next(p.value for p in onnx.load(str(qq)).metadata_props if p.key == "qcli.config"))
    assert config["activations"]["dtype"] != "float"


def test_sample_cnn(cli, tmp_path) -> None:
    cnn = SAMPLE_MODELS / "cnn"
    out = tmp_path / "cnn.onnx"
    doc = cli.json("quantize", cnn / "model.onnx", "-o", out, "--data", cnn / "calib")
    assert doc["float"] == []
    assert doc["quantized"]["Conv"] == 9
    assert "folded 9 BatchNormalization nodes into Conv" in doc["notes"]
    fused = fused_op_counts(out, tmp_path)
    assert fused["QLinearConv"] == 9 and fused["Conv"] == 0
    assert os.path.getsize(cnn / "model.onnx") / os.path.getsize(out) > 3.7  # measured 3.72


def test_eval_data_gate(cli, residual, residual_data, tmp_path) -> None:
    out = tmp_path / "q.onnx"
    doc = cli.json("quantize", residual, "-o", out, "--data", residual_data, "--eval-data", residual_data)
    assert doc["evaluation"]["fidelity"][0]["cosine"] > 0.99
    assert doc["evaluation"]["summary"].startswith("top-1 agreement")
    missing = cli("quantize", residual, "-o", out, "--data", residual_data, "--max-accuracy-drop", "0.01")
    assert missing.exit_code == 2
    assert "error: --max-accuracy-drop needs --eval-data DIR to measure the drop on" in missing.stderr


def test_quantize_rounds_half_to_even_and_clips_like_quantizelinear() -> None:
    """The in-place float32 arithmetic of `scheme.quantize` against onnxruntime's QuantizeLinear:
    per channel with zero points, a one-value weight, values far out of range."""
    import onnxruntime as ort
    from onnx import helper, numpy_helper

    from qcli.scheme import quant_dtype
    from qcli.scheme import quantize as q

    x = np.array([[-3.0, -0.25, 0.25, 0.75, 1e30], [2.5, -1e9, 0.0, 1.5, -0.35]], np.float32)
    scale, zero = np.array([0.5, 0.1], np.float32), np.array([3, 250], np.uint8)
    node = helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"], axis=0)
    graph = helper.make_graph([node], "q", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 5])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.UINT8, [2, 5])],
                              [numpy_helper.from_array(scale, "s"), numpy_helper.from_array(zero, "z")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(q(x, scale, zero, quant_dtype("uint8"), axis=0), expected)
    assert q(np.float32(0.3), np.float32(0.1), np.int8(0), quant_dtype("int8"), symmetric=True) == 3


def test_builds_from_one_prepared_model_share_its_quantized_weights(tmp_path: Path) -> None:
    """The precision search builds many candidates from one prepared model: its weights are
    quantized once (`PrepareResult.quantized`, read-only arrays) and every later build is the
    same bytes as a build from scratch, static and dynamic (MatMulInteger, the int8 embedding
    table) alike, also when the build copies the graph without its initializers and adds back
    the ones still read; a config that changes the weights first (SmoothQuant) does not use
    them."""
    from qcli.config import load_config
    from qcli.data import DataFolder, model_inputs
    from qcli.quantize import calibrate, prepare_for, quantize

    transformer = SAMPLE_MODELS / "transformer"
    model = onnx.load(transformer / "model.onnx")
    folder = DataFolder(transformer / "calib", model_inputs(model), samples=16)
    for preset in ("default", "dynamic"):
        config = load_config(preset)
        table = calibrate(model, folder, config, methods=(config.calibration.method,))
        prepared = prepare_for(model, config)
        first = quantize(model, config, table, prepared=prepared).model.SerializeToString()
        weights = prepared.quantized.weights.values()
        assert weights and all(not a.flags.writeable for w in weights for a in w)
        assert prepared.quantized.shell is not None and not prepared.quantized.shell.graph.initializer
        again = quantize(model, config, table, prepared=prepared).model.SerializeToString()
        fresh = quantize(model, config, table).model.SerializeToString()
        assert first == again == fresh
    smooth = load_config(None).merged(recovery={"smoothquant": {}})
    table = calibrate(model, folder, smooth, methods=("mse",))
    prepared = prepare_for(model, smooth)
    quantize(model, smooth, table, prepared=prepared)
    assert prepared.quantized.weights == {} and prepared.quantized.shell is None


def test_a_lean_build_runs_as_the_full_build_without_copying_float_weights() -> None:
    """A lean build (the search's fold models: sessions only) keeps its float weights as
    references to the prepared model's, held once in memory (`SharedStore`): its session's
    outputs are the full build's, bit for bit, and its bytes hold none of those weights."""
    from qcli.config import Match, Override, load_config
    from qcli.data import DataFolder, model_inputs
    from qcli.quantize import calibrate, prepare_for, quantize
    from qcli.runtime import make_session

    transformer = SAMPLE_MODELS / "transformer"
    model = onnx.load(transformer / "model.onnx")
    folder = DataFolder(transformer / "calib", model_inputs(model), samples=8)
    config = load_config(None)
    config = config.model_copy(update={"overrides": [Override(match=Match(op_types=["MatMul"]), precision="float")]})
    table = calibrate(model, folder, config, methods=(config.calibration.method,))
    prepared = prepare_for(model, config)
    full = quantize(model, config, table, prepared=prepared).model
    lean = quantize(model, config, table, prepared=prepared, lean=True).model
    referenced = [t.name for t in lean.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert referenced and prepared.quantized.shared is not None
    assert set(referenced) == prepared.quantized.shared.held
    assert len(lean.SerializeToString()) < len(full.SerializeToString()) / 2
    feeds = next(iter(folder.batches(4))).inputs
    expected = make_session(full).run(None, feeds)
    got = make_session(lean).run(None, feeds)
    assert all(np.array_equal(a, b) for a, b in zip(expected, got, strict=True))
