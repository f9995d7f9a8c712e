"""Weight-only int8 (`activations: {dtype: float}`): the weights stored as integers, dequantized
by Cast and Mul that onnxruntime folds at load (qcli/weightonly.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from tests.conftest import _values, fused_op_counts, normal_folder, op_counts, parse_model, save

MODEL = """
<ir_version: 8, opset_import: ["" : 17]>
net (float[N, 4, 8, 8] x) => (float[N, 5] y)
    <float[8, 4, 3, 3] w = {W}, float[8] b = {0.1, -0.2, 0.3, 0, 0.05, -0.1, 0.2, 0.0}, float[8, 5] m = {M}> {
    c = Conv <pads = [1, 1, 1, 1]> (x, w, b)
    r = Relu (c)
    p = GlobalAveragePool (r)
    f = Flatten (p)
    y = MatMul (f, m)
}
"""


def _model(tmp_path: Path) -> Path:
    return save(parse_model(MODEL.replace("{W}", _values(288, 1)).replace("{M}", _values(40, 2))), tmp_path / "m.onnx")


def _quantize(cli, tmp_path: Path, weights: str) -> Path:
    config = tmp_path / "c.yaml"
    config.write_text(f"version: 1\nverify: {{enabled: false}}\nactivations: {{dtype: float}}\nweights: {weights}\n")
    out = tmp_path / "q.onnx"
    data = normal_folder(tmp_path / "calib", 4, x=(1, 4, 8, 8))
    assert cli("quantize", _model(tmp_path), "-o", out, "--data", data, "--config", config).exit_code == 0
    return out


def _dequantized(model: onnx.ModelProto, name: str) -> np.ndarray:
    """(q - zero) * scale of weight `name`, as DequantizeLinear computes it."""
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    zero = inits.get(f"{name}_zero_point", np.zeros(1, np.float32))
    return ((inits[f"{name}_quantized"].astype(np.float32) - zero) * inits[f"{name}_scale"]).astype(np.float32)


def _run(model: onnx.ModelProto | Path, x: np.ndarray) -> np.ndarray:
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def test_weight_only_weights_fold_to_float_at_load(cli, tmp_path: Path) -> None:
    out = _quantize(cli, tmp_path, "{dtype: int8, symmetric: true}")
    ops = op_counts(out)
    assert ops["DequantizeLinear"] == 0 and ops["Cast"] == 2 and ops["Mul"] == 2 and ops["Sub"] == 0
    written = onnx.load(str(out))
    assert {t.name: t.data_type for t in written.graph.initializer}["w_quantized"] == onnx.TensorProto.INT8
    fused = fused_op_counts(out, tmp_path)  # what onnxruntime runs: float kernels, nothing per run
    assert not {"Cast", "DequantizeLinear", "MatMulNBits", "Mul"} & set(fused) and fused["MatMul"] == 1
    # the same values as DequantizeLinear's, computed in float: the float model with those weights
    reference = _model(tmp_path)
    float_model = onnx.load(str(reference))
    for t in float_model.graph.initializer:
        if t.name in ("w", "m"):
            t.CopyFrom(numpy_helper.from_array(_dequantized(written, t.name), t.name))
    x = np.random.default_rng(0).normal(size=(2, 4, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(_run(out, x), _run(float_model, x), rtol=1e-6, atol=1e-6)


def test_16_bit_weights_fold_too_with_rounding_256x_finer(cli, tmp_path: Path) -> None:
    """`weights.dtype: int16` under float activations: int16 initializers, Cast and Mul folded at
    load (half the float bytes), the values DequantizeLinear's, their error ~1/256 of int8's."""
    out = _quantize(cli, tmp_path, "{dtype: int16}")
    written = onnx.load(str(out))
    types = {t.name: t.data_type for t in written.graph.initializer}
    assert types["w_quantized"] == types["m_quantized"] == onnx.TensorProto.INT16 and "w" not in types
    assert not {"Cast", "DequantizeLinear", "Mul"} & set(fused_op_counts(out, tmp_path))
    w = numpy_helper.to_array(next(t for t in onnx.load(str(_model(tmp_path))).graph.initializer if t.name == "w"))
    step = np.abs(w).reshape(8, -1).max(axis=1) / 32767  # per output channel
    error = np.abs(_dequantized(written, "w") - w).reshape(8, -1).max(axis=1)
    assert np.all(error <= step / 2 * (1 + 1e-3))
    int8 = _quantize(cli, tmp_path / "8", "{dtype: int8}") if (tmp_path / "8").mkdir() is None else None
    assert int8 is not None
    error8 = np.abs(_dequantized(onnx.load(str(int8)), "w") - w).max()
    assert error.max() < error8 / 100


def test_16_bit_weights_beside_quantized_activations_are_dequantized(cli, tmp_path: Path) -> None:
    """No int8 kernel takes 16-bit weights: with uint8 activations the Conv reads its weight
    through a DequantizeLinear (com.microsoft's below opset 21) and computes in float."""
    config = tmp_path / "c.yaml"
    config.write_text("version: 1\nverify: {enabled: false}\nweights: {dtype: int16}\n")
    out = tmp_path / "q.onnx"
    data = normal_folder(tmp_path / "calib", 4, x=(1, 4, 8, 8))
    doc = cli.json("quantize", _model(tmp_path), "-o", out, "--data", data, "--config", config)
    assert doc["precisions"]["Conv"] == {"uint8 act, int16 weights": 1}
    x = np.random.default_rng(0).normal(size=(2, 4, 8, 8)).astype(np.float32)
    assert np.abs(_run(out, x) - _run(_model(tmp_path), x)).max() < 0.05


LSTM = """
<ir_version: 8, opset_import: ["" : 17]>
net (float[T, 1, 6] x) => (float[T, 1, 1, 5] y) <float[1, 20, 6] w = {W}, float[1, 20, 5] r = {R}> {
    y = LSTM <hidden_size = 5> (x, w, r)
}
"""


def test_recurrent_weights_are_stored_weight_only(cli, tmp_path: Path) -> None:
    """An LSTM has no int8 kernel; under float activations its W and R are stored as integers
    all the same, per channel along their 4 x hidden rows, and fold at load: the LSTM computes
    exactly what onnxruntime computes with the dequantized weights."""
    model = save(parse_model(LSTM.replace("{W}", _values(120, 1)).replace("{R}", _values(100, 2))), tmp_path / "m.onnx")
    config = tmp_path / "c.yaml"
    config.write_text("version: 1\nverify: {enabled: false}\nactivations: {dtype: float}\nweights: {dtype: int16}\n")
    out = tmp_path / "q.onnx"
    doc = cli.json("quantize", model, "-o", out, "--data", normal_folder(tmp_path / "calib", 4, x=(3, 1, 6)),
                   "--config", config)
    assert doc["precisions"] == {"LSTM": {"float act, int16 weights": 1}}
    written = onnx.load(str(out))
    scales = {t.name: list(t.dims) for t in written.graph.initializer if t.name.endswith("_scale")}
    assert scales == {"w_scale": [1, 20, 1], "r_scale": [1, 20, 1]}
    assert not {"Cast", "Mul"} & set(fused_op_counts(out, tmp_path))
    reference = onnx.load(str(model))
    for t in reference.graph.initializer:
        t.CopyFrom(numpy_helper.from_array(_dequantized(written, t.name), t.name))
    x = np.random.default_rng(0).normal(size=(7, 1, 6)).astype(np.float32)
    np.testing.assert_array_equal(_run(out, x), _run(reference, x))
    np.testing.assert_allclose(_run(out, x), _run(model, x), atol=1e-4)


EINSUM = """
<ir_version: 8, opset_import: ["" : 17]>
net (float[N, 6] x) => (float[N, 5] y) <float[5, 6] w = {W}> {
    h = Einsum <equation = "ij,nj->ni"> (w, x)
    y = Einsum <equation = "ni,ni->ni"> (h, h)
}
"""


def test_an_einsum_s_constant_operand_is_stored_weight_only(cli, tmp_path: Path) -> None:
    """Einsum has no int8 kernel; under float activations its constant operand (here the first)
    is stored as integers all the same, one scale (the equation decides which axis would be a
    channel), and folds at load: exactly what onnxruntime computes with the dequantized weight.
    An Einsum of two activations stays as it is."""
    model = save(parse_model(EINSUM.replace("{W}", _values(30, 3))), tmp_path / "m.onnx")
    config = tmp_path / "c.yaml"
    config.write_text("version: 1\nverify: {enabled: false}\nactivations: {dtype: float}\n")
    out = tmp_path / "q.onnx"
    doc = cli.json("quantize", model, "-o", out, "--data", normal_folder(tmp_path / "calib", 4, x=(3, 6)),
                   "--config", config)
    assert doc["precisions"]["Einsum"] == {"float act, int8 weights": 1}  # not the one of two activations
    written = onnx.load(str(out))
    assert [n.op_type for n in written.graph.node].count("Einsum") == 2
    assert {t.name: list(t.dims) for t in written.graph.initializer if t.name.endswith("_scale")} == {"w_scale": []}
    assert not {"Cast", "Mul"} & set(fused_op_counts(out, tmp_path))
    reference = onnx.load(str(model))
    reference.graph.initializer[0].CopyFrom(numpy_helper.from_array(_dequantized(written, "w"), "w"))
    x = np.random.default_rng(0).normal(size=(7, 6)).astype(np.float32)
    np.testing.assert_array_equal(_run(out, x), _run(reference, x))
    np.testing.assert_allclose(_run(out, x), _run(model, x), rtol=0.05, atol=0.05)


def test_asymmetric_weights_subtract_their_zero_point(cli, tmp_path: Path) -> None:
    out = _quantize(cli, tmp_path, "{dtype: uint8, symmetric: false, granularity: per_tensor}")
    ops = op_counts(out)
    assert ops["DequantizeLinear"] == 0 and ops["Sub"] >= 1
    assert "DequantizeLinear" not in fused_op_counts(out, tmp_path)


OUTLIER_MLP = """
<ir_version: 8, opset_import: ["" : 17]>
net (float[N, 16] x) => (float[N, 4] y) <float[16, 32] w1 = {W1}, float[32, 4] w2 = {W2}> {
    h = MatMul (x, w1)
    r = Relu (h)
    y = MatMul (r, w2)
}
"""


def _loud(seed: int, n: int) -> np.ndarray:
    """n samples of 16 normal channels, the first 300x the others."""
    x = np.random.default_rng(seed).normal(size=(n, 16)).astype(np.float32)
    x[:, 0] *= 300
    return x


def _loud_folder(folder: Path) -> Path:
    folder.mkdir()
    for i in range(32):
        np.savez(folder / f"{i:03d}.npz", x=_loud(100 + i, 1))
    return folder


def test_the_rescue_writes_the_model_weight_only_when_int8_activations_cannot_hold(cli, tmp_path: Path) -> None:
    """One input channel 300x the others: any 8-bit activation grid (static or dynamic) rounds
    the small channels away, so the rescue ends float; int8 weights with float activations keep
    every decision, and are written instead (qcli/precision/stored.py), reproducibly, as soon as
    the noisiest half, promoted, misses the goal."""
    rng = np.random.default_rng(0)
    w1 = rng.normal(0, 0.5, (16, 32))
    w1[0] = 0.0  # the loud channel does not move the output (a zero weight rounds to itself)
    text = OUTLIER_MLP.replace("{W1}", "{" + ", ".join(f"{v:.5f}" for v in w1.ravel()) + "}")
    model = save(parse_model(text.replace("{W2}", _values(128, 3))), tmp_path / "mlp.onnx")
    folder = _loud_folder(tmp_path / "calib")
    out = tmp_path / "q.onnx"
    doc = cli.json("quantize", model, "-o", out, "--data", folder)
    assert any(n.startswith("weight-only: the rescue's model kept most weights float") for n in doc["notes"])
    assert doc["verification"]["passed"] and op_counts(out)["Cast"] == 2 and op_counts(out)["QuantizeLinear"] == 0
    assert doc["verification"].get("measured_latency") is None  # folded at load: the original's kernels, untimed
    # the noisiest half (the unit reading the loud channel) promoted misses the goal on all
    # samples; beside the other unit's dynamic form it holds, and cannot go back to int8; that
    # model is mostly float, so the weight-only one is taken: no unit measured alone or confirmed
    steps = doc["precision"]["steps"]
    assert [(s["action"].split(" (")[0], s["changed"], s["kept"]) for s in steps[2:]] == [
        ("sensitivity by each unit's own noise", [], True),
        ("the half that missed, every other unit with a dynamic form dynamic, on all samples", ["MatMul_2"], True),
        ("back to int8", ["MatMul_0"], False)]
    assert doc["precision"]["trials"] == 6  # all int8, all dynamic, all int8 quick, the half, beside, back
    assert not any(s["action"].startswith(("confirm", "promote")) for s in steps)
    float_top, kept_top = (_run(m, _loud(7, 4000)).argmax(axis=1) for m in (model, out))
    assert (float_top == kept_top).mean() >= 0.99  # the truth on samples nothing read
    again = tmp_path / "again.onnx"
    assert cli("quantize", model, "-o", again, "--data", folder, "--config", tmp_path / "q.precision.yaml").exit_code == 0
    assert again.read_bytes() == out.read_bytes()


DEEP_MLP = """
<ir_version: 8, opset_import: ["" : 17]>
net (float[N, 16] x) => (float[N, 4] y) <float[16, 64] w1 = {W1}, float[64, {M}] w2 = {W2}, float[{M}, 4] w3 = {W3}> {
    h = MatMul (x, w1)
    r = Relu (h)
    g = MatMul (r, w2)
    s = Relu (g)
    y = MatMul (s, w3)
}
"""


def _deep_mlp(tmp_path: Path, outlier: float, width: int = 16) -> Path:
    """DEEP_MLP (w2's `width` outputs) whose w2 holds `outlier` on a hidden unit that is always
    0 (w1's column 0 is 0): float never counts it, and a grid that holds it rounds the rest of
    w2 to zero."""
    rng = np.random.default_rng(0)
    w1 = rng.normal(0, 0.5, (16, 64))
    w1[0] = 0.0  # the loud channel does not move the output
    w1[:, 0] = 0.0  # hidden unit 0 is always 0...
    w2 = rng.normal(0, 0.5, (64, width))
    w2[0] = outlier  # ...so its huge weights never count in float
    text = DEEP_MLP.replace("{M}", str(width))
    for name, values in (("{W1}", w1), ("{W2}", w2), ("{W3}", rng.normal(0, 0.5, (width, 4)))):
        text = text.replace(name, "{" + ", ".join(f"{v:.5f}" for v in values.ravel()) + "}")
    return save(parse_model(text), tmp_path / "mlp.onnx")


def test_the_rescue_widens_to_16_bits_the_weights_int8_cannot_hold(cli, tmp_path: Path) -> None:
    """As above, and w2 holds a weight 100x the others: its int8 grid rounds the rest of w2 to
    zero, so the whole model weight-only misses too. w2 keeps 16-bit weights (a step of 0.0015
    where its others spread 0.5) and w1 int8 ones (qcli/precision/stored.py, the partial
    search; w3, 3% of the bytes, is not weighed and is 16-bit too; w1 holds 56% of the bytes,
    so int8 there is worth its risk), and that model keeps the decisions of samples nothing
    read, reproducibly."""
    model = _deep_mlp(tmp_path, 50.0, width=12)
    folder = _loud_folder(tmp_path / "calib")
    out = tmp_path / "q.onnx"
    doc = cli.json("quantize", model, "-o", out, "--data", folder)
    note = next(n for n in doc["notes"] if n.startswith("weight-only: "))
    assert "the model with int8 weights (2 units with int16 weights) and float activations" in note
    assert doc["verification"]["passed"]
    types = {t.name: t.data_type for t in onnx.load(out).graph.initializer}
    assert types["w1_quantized"] == onnx.TensorProto.INT8 and "w2" not in types
    assert types["w2_quantized"] == types["w3_quantized"] == onnx.TensorProto.INT16
    assert doc["precisions"]["MatMul"] == {"float act, int16 weights": 2, "float act, int8 weights": 1}
    float_top, kept_top = (_run(m, _loud(7, 4000)).argmax(axis=1) for m in (model, out))
    assert (float_top == kept_top).mean() >= 0.99
    again = tmp_path / "again.onnx"
    assert cli("quantize", model, "-o", again, "--data", folder, "--config", tmp_path / "q.precision.yaml").exit_code == 0
    assert again.read_bytes() == out.read_bytes()


def test_int8_units_beside_16_bit_weights_must_save_a_quarter(cli, tmp_path: Path) -> None:
    """As above with w2 wider: w1 holds 48% of the bytes, and int8 there would cut the 16-bit
    model by less than SAVES asks, not worth a decision on unseen data: 16-bit throughout."""
    model = _deep_mlp(tmp_path, 50.0)
    doc = cli.json("quantize", model, "-o", tmp_path / "q.onnx", "--data", _loud_folder(tmp_path / "calib"))
    assert doc["precisions"] == {"MatMul": {"float act, int16 weights": 3}} and doc["verification"]["passed"]


def test_the_rescue_keeps_float_the_weights_16_bits_cannot_hold(cli, tmp_path: Path) -> None:
    """w2's weight 2e6 times the others: a 16-bit grid (a step of 61) rounds the rest of w2 to
    zero too, so the weights that are not int8 stay float."""
    model = _deep_mlp(tmp_path, 1e6)
    out = tmp_path / "q.onnx"
    doc = cli.json("quantize", model, "-o", out, "--data", _loud_folder(tmp_path / "calib"))
    note = next(n for n in doc["notes"] if n.startswith("weight-only: "))
    assert "the model with int8 weights (2 units with float weights) and float activations" in note
    inits = {t.name: t for t in onnx.load(out).graph.initializer}
    assert {"w1_quantized", "w2", "w3"} <= inits.keys() and "w2_quantized" not in inits
    float_top, kept_top = (_run(m, _loud(7, 4000)).argmax(axis=1) for m in (model, out))
    assert (float_top == kept_top).mean() >= 0.99


class _Holds:
    """Trials whose verdict holds when the int8 units (those `choices` leave out) avoid `bad`
    and number at most `most`, recording each candidate's int8 units ("?": on the quick probe)."""

    def __init__(self, units: str, bad: str, most: int = 99) -> None:
        self.units, self.bad, self.most, self.tried = units, set(bad), most, []

    def fidelity(self, choices, quick=False, stop_below=None):
        assert quick or stop_below == 0.99  # a full trial may stop once it must miss the floor
        int8 = "".join(u for u in self.units if u not in choices)
        self.tried.append(int8 + "?" * quick)
        return not self.bad & set(int8) and len(int8) <= self.most

    def exhausted(self) -> bool:
        return False


def _greedy(wo: _Holds, saves=lambda k: True) -> tuple[int, str]:
    from qcli.precision.stored import _greedy

    class Goal:
        accurate = staticmethod(bool)
        min_top1_agreement = stop_below = 0.99

    order = list(wo.units)
    k = _greedy(wo, Goal(), lambda j: dict.fromkeys(order[j:], "int16"), saves, order)  # type: ignore[arg-type]
    return k, "".join(order)


def test_the_partial_search_sends_what_misses_to_the_back_and_goes_on() -> None:
    """Largest first (qcli/precision/stored.py `_greedy`): 1, 2, 4 units until a miss, then
    bisection; c misses beside a and b and goes to the back, the rest hold with them. A unit
    alone beside those held is screened on the quick probe first."""
    wo = _Holds("abcdefgh", "c")
    assert _greedy(wo) == (7, "abdefghc")
    assert wo.tried == ["a?", "a", "ab", "abcd", "abc", "abd?", "abd", "abde", "abdefg", "abdefgh"]
    wo = _Holds("abcdefgh", "", most=5)  # no single culprit: any sixth unit is one too many
    assert _greedy(wo) == (5, "abcdefgh")
    assert wo.tried == ["a?", "a", "ab", "abcd", "abcdefg", "abcde", "abcdef", "abcdeg?", "abcdeh?"]


def test_a_model_that_misses_with_any_unit_int8_stops_after_two_units() -> None:
    """a and b each miss alone on the quick probe (nakdimon): two rounds that keep none end
    the search, one quick trial each; so does a culprit that leaves too few bytes (`saves`)."""
    wo = _Holds("abcdefgh", "ab")
    assert _greedy(wo) == (0, "cdefghab") and wo.tried == ["a?", "b?"]
    wo = _Holds("abcdefgh", "a")
    assert _greedy(wo, saves=lambda k: k >= 8) == (0, "bcdefgha") and wo.tried == ["a?"]


def test_a_weight_control_flow_reads_too_is_stored_once_folded_under_its_name(cli, tmp_path: Path) -> None:
    """`w` is read by a MatMul and, from the outer scope, by a Loop body (nakdimon's Keras
    LSTMs): int8 kernels would store it twice, so a quantized MatMul leaves it float. Weight-only,
    the folded value takes the name `w` and every reader reads it: stored once, in 16 bits, and
    the model computes what onnxruntime computes with the dequantized `w` everywhere."""
    from tests.test_half import LOOP

    model = save(parse_model(LOOP), tmp_path / "loop.onnx")
    config = tmp_path / "c.yaml"
    config.write_text("version: 1\nverify: {enabled: false}\nactivations: {dtype: float}\nweights: {dtype: int16}\n")
    out = tmp_path / "q.onnx"
    doc = cli.json("quantize", model, "-o", out, "--data", normal_folder(tmp_path / "calib", 4, x=(2, 4)),
                   "--config", config)
    assert doc["precisions"] == {"MatMul": {"float act, int16 weights": 1}}
    written = onnx.load(str(out))
    types = {t.name: t.data_type for t in written.graph.initializer}
    assert types["w_quantized"] == onnx.TensorProto.INT16 and "w" not in types and types["k"] == onnx.TensorProto.FLOAT
    assert [n.op_type for n in written.graph.node if "w" in n.output] == ["Mul"]
    onnx.checker.check_model(written, full_check=True)
    reference = onnx.load(str(model))
    w = next(t for t in reference.graph.initializer if t.name == "w")
    w.CopyFrom(numpy_helper.from_array(_dequantized(written, "w"), "w"))
    x = np.random.default_rng(0).normal(size=(2, 4)).astype(np.float32)
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    expected = ort.InferenceSession(reference.SerializeToString(), providers=["CPUExecutionProvider"])
    for got, want in zip(session.run(None, {"x": x}), expected.run(None, {"x": x}), strict=True):
        np.testing.assert_array_equal(got, want)


IF_MODEL = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2, 4] x, bool c) => (float[2, 4] y)
    <float[4, 4] w = {0.5, -1, 2, 0.25, 1.5, -0.75, 1, 2, -2, 0.125, 3, -1, 1, 0.3, 0.1, 0.7}> {
    y = If (c) <then_branch = t () => (float[2, 4] a) {
                    wt = Transpose <perm = [1, 0]> (w)
                    a = MatMul (x, wt)
                }, else_branch = e () => (float[2, 4] b) {
                    b = MatMul (x, w)
                }>
}
"""


def test_a_weight_only_branches_read_is_stored_weight_only_and_the_if_is_a_unit(cli, tmp_path: Path) -> None:
    """Silero VAD's LSTM sits in If branches, which read its weights from the outer scope
    (sliced and reordered on the way): weight-only, such a weight is stored in integers all the
    same, its folded value under its own name; the If owns it (a unit of the precision search)."""
    from qcli.config import load_config
    from qcli.plan import make_plan
    from qcli.precision.units import find_units

    model = save(parse_model(IF_MODEL), tmp_path / "if.onnx")
    config = tmp_path / "c.yaml"
    config.write_text("version: 1\nverify: {enabled: false}\nactivations: {dtype: float}\nweights: {dtype: int16}\n")
    plan = make_plan(onnx.load(str(model)), load_config(config))
    assert plan.control_flow == {0: ["w"]} and plan.weights["w"].axis == 0  # moved (transposed): rows
    assert [(u.node, u.weighted) for u in find_units(onnx.load(str(model)), plan)] == [("If_0", True)]
    out = tmp_path / "q.onnx"
    folder = tmp_path / "calib"
    folder.mkdir()
    for i in range(4):
        np.savez(folder / f"{i}.npz", x=np.random.default_rng(i).normal(size=(2, 4)).astype(np.float32),
                 c=np.array(i % 2 == 0))
    doc = cli.json("quantize", model, "-o", out, "--data", folder, "--config", config)
    assert doc["precisions"] == {"If": {"float act, int16 weights": 1}}
    written = onnx.load(str(out))
    types = {t.name: t.data_type for t in written.graph.initializer}
    assert types == {"w_quantized": onnx.TensorProto.INT16, "w_scale": onnx.TensorProto.FLOAT}
    reference = onnx.load(str(model))
    reference.graph.initializer[0].CopyFrom(numpy_helper.from_array(_dequantized(written, "w"), "w"))
    x = np.random.default_rng(9).normal(size=(2, 4)).astype(np.float32)
    for c in (True, False):
        feed = {"x": x, "c": np.array(c)}
        got = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, feed)[0]
        want = ort.InferenceSession(reference.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)
        np.testing.assert_array_equal(got, want[0])


def test_int4_blocks_with_negative_scales_run_fused_as_dequantizelinear_computes_them(cli, tmp_path: Path) -> None:
    """Symmetric int4 puts each block's largest magnitude at -8, so a block whose largest value is
    positive has a negative scale (qcli.scheme.full_range): MatMulNBits, which onnxruntime fuses
    from DequantizeLinear + MatMul, must compute what DequantizeLinear does with them."""
    rng = np.random.default_rng(5)
    w = rng.normal(0, 0.3, (64, 16)).astype(np.float32)
    model = helper_model(w, tmp_path / "mm.onnx")
    config = tmp_path / "c.yaml"
    config.write_text("version: 1\nverify: {enabled: false}\nactivations: {dtype: float}\n"
                      "weights: {dtype: int4, symmetric: true, granularity: per_block, block_size: 32}\n")
    out = tmp_path / "q.onnx"
    data = normal_folder(tmp_path / "calib", 4, x=(64,))
    assert cli("quantize", model, "-o", out, "--data", data, "--config", config).exit_code == 0
    inits = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(out)).graph.initializer}
    scales = inits["w_scale"]
    assert (scales < 0).any() and (scales > 0).any()
    deq = inits["w_quantized"].astype(np.float32) * np.repeat(scales, 32, axis=0)  # [64, 16]
    assert (np.abs(deq - w) <= np.repeat(np.abs(scales), 32, axis=0) + 1e-6).all()  # within its block's step
    assert fused_op_counts(out, tmp_path)["MatMulNBits"] == 1
    x = rng.normal(size=(3, 64)).astype(np.float32)
    unfused = ort.SessionOptions()
    unfused.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    plain = ort.InferenceSession(str(out), unfused, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    fused = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(fused, plain, rtol=0, atol=0.02 * np.abs(plain).max())  # int8 activations inside
    np.testing.assert_allclose(plain, x @ deq, rtol=1e-5, atol=1e-5)


def helper_model(w: np.ndarray, path: Path) -> Path:
    """y = x @ w, x [N, K]."""
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("MatMul", ["x", "w"], ["y"], name="fc")], "mm",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", w.shape[0]])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", w.shape[1]])],
        [numpy_helper.from_array(w, "w")])
    return save(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 21)]), path)
