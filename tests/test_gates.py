"""HardSwish and HardSigmoid between Q/DQ pairs as integer Add and Mul (qcli/gates.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from qcli.gates import integer_gates
from tests.conftest import _values, fused_op_counts, normal_folder, op_counts, parse_model, save

PAIR = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2, 4, 16, 16] x) => (float[2, 4, 16, 16] y)
    <float xs = {0.05}, uint8 xz = {128}, float ys = {YS}, uint8 yz = {YZ}> {
    xq = QuantizeLinear (x, xs, xz)
    xd = DequantizeLinear (xq, xs, xz)
    h = OP (xd)
    hq = QuantizeLinear (h, ys, yz)
    y = DequantizeLinear (hq, ys, yz)
}
"""


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def _pair(op: str, ys: float, yz: int) -> onnx.ModelProto:
    return parse_model(PAIR.replace("OP", op).replace("{YS}", f"{{{ys}}}").replace("{YZ}", f"{{{yz}}}"))


def _inputs() -> np.ndarray:
    return np.random.default_rng(0).uniform(-6.4, 6.35, (2, 4, 16, 16)).astype(np.float32)


def test_hardswish_is_an_integer_add_and_mul_off_by_at_most_one_step():
    model = _pair("HardSwish", 0.03, 13)
    before = _run(model, _inputs())
    assert integer_gates(model.graph, set()) == 1
    onnx.checker.check_model(model)
    assert [n.op_type for n in model.graph.node].count("HardSwish") == 0
    after = _run(model, _inputs())
    # the gate's rounding (6 over 255 steps: x * 0.002 at most) moves an output by less than half
    # its step (0.03) here: one step where that crosses a rounding boundary (~5% of these codes)
    steps = np.rint((after - before) / 0.03)
    assert np.abs(steps).max() <= 1
    assert (steps == 0).mean() > 0.9


def test_hardsigmoid_keeps_the_output_integers():
    model = _pair("HardSigmoid <alpha = 0.2, beta = 0.5>", 1 / 255, 0)
    before = _run(model, _inputs())
    assert integer_gates(model.graph, set()) == 1
    assert {n.op_type for n in model.graph.node} == {"QuantizeLinear", "DequantizeLinear", "Add"}
    after = _run(model, _inputs())
    assert np.abs(np.rint((after - before) * 255)).max() <= 1
    assert (np.rint((after - before) * 255) == 0).mean() > 0.99


def test_left_alone_when_saturation_would_not_clip_or_the_scheme_is_symmetric():
    wide = _pair("HardSigmoid", 2 / 255, 0)  # its quantizer reaches 2: the clip at 1 matters
    assert integer_gates(wide.graph, set()) == 0
    offset = _pair("HardSigmoid", 1 / 255, 3)  # zero point above the type's minimum
    assert integer_gates(offset.graph, set()) == 0
    symmetric = _pair("HardSwish", 0.03, 13)
    assert integer_gates(symmetric.graph, {"h"}) == 0


CONVS = """
<ir_version: 8, opset_import: ["" : 17]>
net (float[N, 4, 12, 12] x) => (float[N, 4, 12, 12] y)
    <float[8, 4, 3, 3] w1 = {W1}, float[8, 8, 1, 1] w2 = {W2}, float[4, 8, 3, 3] w3 = {W3}> {
    c1 = Conv <pads = [1, 1, 1, 1]> (x, w1)
    h1 = HardSwish (c1)
    c2 = Conv (h1, w2)
    h2 = HardSigmoid <alpha = 0.16666667, beta = 0.5> (c2)
    y = Conv <pads = [1, 1, 1, 1]> (h2, w3)
}
"""


def _quantized(cli, tmp_path: Path, text: str, settings: str = "", name: str = "q") -> tuple[Path, Path, Path]:
    """(model, its calibration folder, the model quantized with `settings`, unverified)."""
    model = save(parse_model(text), tmp_path / "m.onnx")
    data = normal_folder(tmp_path / "calib", 8, x=(1, 4, 12, 12))
    config = tmp_path / f"{name}.yaml"
    config.write_text(f"version: 1\nverify: {{enabled: false}}\n{settings}")
    out = tmp_path / f"{name}.onnx"
    assert cli("quantize", model, "-o", out, "--data", data, "--config", config).exit_code == 0
    return model, data, out


def test_quantize_writes_what_onnxruntime_runs_in_integers(cli, tmp_path: Path):
    text = CONVS.replace("{W1}", _values(288, 1)).replace("{W2}", _values(64, 2)).replace("{W3}", _values(288, 3))
    model, data, out = _quantized(cli, tmp_path, text)
    assert op_counts(out)["HardSwish"] == op_counts(out)["HardSigmoid"] == 0
    fused = fused_op_counts(out, tmp_path)
    assert fused["QLinearConv"] == 3 and fused["QLinearAdd"] == 2 and fused["QLinearMul"] == 1
    assert not {"HardSwish", "HardSigmoid", "Mul", "Add"} & set(fused)
    layers = cli.json("analyze", model, out, "--data", data)["layers"]  # measured under their names
    assert {"h1", "h2"} <= {t["tensor"] for t in layers["tensors"]} and layers["skipped"] == []
    symmetric = _quantized(cli, tmp_path, text, "activations: {dtype: int8, symmetric: true}\n", "s")[2]
    assert op_counts(symmetric)["HardSwish"] == 1


WRITTEN_OUT = """
<ir_version: 8, opset_import: ["" : 17]>
net (float[N, 4, 12, 12] x) => (float[N, 4, 12, 12] y)
    <float[4, 4, 3, 3] w1 = {W1}, float[4, 4, 3, 3] w2 = {W3}, float three = {3.0}, float zero = {0.0},
     float six = {6.0}> {
    c = Conv <pads = [1, 1, 1, 1]> (x, w1)
    a = Add (c, three)
    k = Clip (a, zero, six)
    p = Mul (c, k)
    h = Div (p, six)
    s = Add (h, c)
    y = Conv <pads = [1, 1, 1, 1]> (s, w2)
}
"""


def test_a_hardswish_written_out_runs_in_integers_too(cli, tmp_path: Path):
    """PaddleOCR's x * Clip(x + 3, 0, 6) / 6 (qcli/prepare/canonicalize.py): no float Div left."""
    text = WRITTEN_OUT.replace("{W1}", _values(144, 1)).replace("{W3}", _values(144, 3))
    fused = fused_op_counts(_quantized(cli, tmp_path, text)[2], tmp_path)
    assert fused["QLinearConv"] == 2 and fused["QLinearAdd"] == 2 and fused["QLinearMul"] == 1
    assert not {"Div", "HardSigmoid", "Mul", "Add", "Clip"} & set(fused)
