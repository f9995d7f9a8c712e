"""SmoothQuant (recovery: [smoothquant]): factors against a numpy reference, float equivalence of
the smoothed graph, where 1/s goes (LayerNormalization, a bias Add's MatMul, a 1x1 Conv's
producer, or an explicit Mul), int8 error with and without it on models with outlier channels,
the calibration file, the CLI, fused kernels and determinism."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from qcli.calibrate.channels import ROW_SAMPLES, ChannelObserver
from qcli.calibrate.collect import session_with_outputs
from qcli.config import Config
from qcli.data import DataFolder, model_inputs
from qcli.quantize import calibrate, prepare_for, quantize
from qcli.recovery.smoothquant import factors, smooth
from tests.conftest import fused_op_counts, normal_folder, parse_model, save, write_npz

C = 16


def _vals(a: np.ndarray) -> str:
    return "{" + ", ".join(f"{v:.6f}" for v in np.ravel(a)) + "}"


def _gamma() -> np.ndarray:
    g = np.ones(C)
    g[3], g[7] = 30.0, -12.0  # the outlier channels a trained LayerNorm's scale makes
    return g


def ln_model(residual: bool = False) -> onnx.ModelProto:
    """x -> LayerNormalization (outlier scale) -> MatMul -> Relu -> MatMul; `residual`: the LN
    output is also added to the first MatMul's output (a reader SmoothQuant does not smooth)."""
    rng = np.random.default_rng(1)
    w, w2, b = rng.normal(0, 0.3, (C, C)), rng.normal(0, 0.3, (C, C)), rng.normal(0, 0.1, C)
    tail = "s = Add(y, h)\n  r = Relu(s)" if residual else "r = Relu(y)"
    return parse_model(f"""<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 4, {C}] x) => (float[N, 4, {C}] z) <float[{C}] g = {_vals(_gamma())}, float[{C}] b = {_vals(b)},
    float[{C},{C}] w = {_vals(w)}, float[{C},{C}] w2 = {_vals(w2)}> {{
  h = LayerNormalization<axis=-1>(x, g, b)
  y = MatMul(h, w)
  {tail}
  z = MatMul(r, w2)
}}""")


def chain_model() -> onnx.ModelProto:
    """x -> MatMul -> Add(bias) -> MatMul: the outlier column of the first weight makes an
    outlier channel the second reads; 1/s folds into the first weight's columns and the bias."""
    rng = np.random.default_rng(2)
    w0, w1, b0 = rng.normal(0, 0.3, (C, C)), rng.normal(0, 0.3, (C, C)), rng.normal(0, 0.1, C)
    w0[:, 5] *= 40.0
    return parse_model(f"""<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 4, {C}] x) => (float[N, 4, {C}] z) <float[{C},{C}] w0 = {_vals(w0)}, float[{C}] b0 = {_vals(b0)},
    float[{C},{C}] w1 = {_vals(w1)}> {{
  t = MatMul(x, w0)
  a = Add(t, b0)
  z = MatMul(a, w1)
}}""")


def conv_model() -> onnx.ModelProto:
    """3x3 Conv (an outlier output channel) -> Relu -> 1x1 Conv: the Relu stands between, so an
    explicit Mul of shape [C, 1, 1] divides; Conv -> 1x1 Conv folds into the first Conv."""
    rng = np.random.default_rng(3)
    w0, w1, w2 = rng.normal(0, 0.3, (8, 3, 3, 3)), rng.normal(0, 0.3, (8, 8, 1, 1)), rng.normal(0, 0.3, (4, 8, 1, 1))
    w0[2] *= 30.0
    return parse_model(f"""<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 3, 8, 8] x) => (float[N, 4, 8, 8] z) <float[8,3,3,3] w0 = {_vals(w0)}, float[8,8,1,1] w1 = {_vals(w1)},
    float[4,8,1,1] w2 = {_vals(w2)}> {{
  c0 = Conv<pads=[1,1,1,1]>(x, w0)
  r0 = Relu(c0)
  c1 = Conv(r0, w1)
  z = Conv(c1, w2)
}}""")


def data(folder: Path, shape: tuple[int, ...], n: int = 64, seed: int = 0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(n):
        write_npz(folder / f"{i:03d}.npz", x=rng.normal(0, 1, (1, *shape)).astype(np.float32))
    return folder


def sq(alpha: float | str = 0.5, **extra) -> Config:
    return Config.model_validate({"recovery": {"smoothquant": {"alpha": alpha}}, **extra})


def run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def rel_error(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(a))


def table_for(model: onnx.ModelProto, folder: Path, config: Config):
    return calibrate(model, DataFolder(folder, model_inputs(model)), config)


def test_factors_match_numpy_reference_and_fold_into_layernorm(tmp_path: Path) -> None:
    model, config = ln_model(), sq(0.5)
    folder = data(tmp_path / "d", (4, C))
    table = table_for(model, folder, config)
    # the reference: h of every calibration sample, by onnxruntime, reduced in numpy
    session = session_with_outputs(model, ["h"])
    h = np.concatenate([session.run(["h"], {"x": np.load(f)["x"]})[0].reshape(-1, C) for f in sorted(folder.glob("*.npz"))])
    w = numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == "w"))
    s_ref = np.abs(h).max(0) ** 0.5 / np.abs(w).max(1) ** 0.5
    np.testing.assert_allclose(table.channels["h"].absmax, np.abs(h).max(0), rtol=1e-6)
    smoothed = smooth(prepare_for(model, config).model, config, table)
    inits = {i.name: numpy_helper.to_array(i) for i in smoothed.model.graph.initializer}
    np.testing.assert_allclose(inits["w"], w * s_ref[:, None], rtol=1e-5)
    np.testing.assert_allclose(inits["g"], _gamma() / s_ref, rtol=1e-5)
    assert smoothed.layers[0].into == "LayerNormalization 'h'" and smoothed.layers[0].alpha == 0.5
    assert [n.input[0] for n in smoothed.model.graph.node if n.op_type == "Mul"] == ["r"]  # r's explicit Mul only
    lo, hi = smoothed.table.derived["h"]  # the smoothed range: the channels' min / s, max / s
    assert lo == pytest.approx(float((h.min(0) / s_ref).min()), rel=1e-5)
    assert hi == pytest.approx(float((h.max(0) / s_ref).max()), rel=1e-5)


def test_factor_edge_cases() -> None:
    s = factors(np.array([0.0, 4.0, 1e12]), np.array([1.0, 0.0, 1e-12]), 0.5)
    assert s.tolist() == [1.0, 1.0, 1e4]  # a dead channel keeps 1; the clamp bounds the rest


@pytest.mark.parametrize(("make", "shape", "into"), [
    (ln_model, (4, C), {"h": "LayerNormalization 'h'", "r": "explicit Mul"}),
    (lambda: ln_model(residual=True), (4, C), {"h": "explicit Mul", "r": "explicit Mul"}),
    (chain_model, (4, C), {"x": "explicit Mul", "a": "Add 'a' + MatMul 't'"}),
    (conv_model, (3, 8, 8), {"r0": "explicit Mul", "c1": "Conv 'c1'"}),
])
def test_smoothed_float_model_equals_the_original(tmp_path: Path, make, shape, into) -> None:
    model, config = make(), sq(0.5)
    table = table_for(model, data(tmp_path / "d", shape), config)
    smoothed = smooth(prepare_for(model, config).model, config, table)
    assert {layer.tensor: layer.into for layer in smoothed.layers} == into
    onnx.checker.check_model(smoothed.model)
    x = np.random.default_rng(9).normal(0, 1, (8, *shape)).astype(np.float32)
    assert rel_error(run(model, x), run(smoothed.model, x)) < 1e-5


def test_residual_reader_keeps_layernorm_unchanged(tmp_path: Path) -> None:
    """A LayerNorm output the residual Add reads too is not folded: the Add needs h itself."""
    model, config = ln_model(residual=True), sq(0.5)
    table = table_for(model, data(tmp_path / "d", (4, C)), config)
    out = smooth(prepare_for(model, config).model, config, table).model
    inits = {i.name: numpy_helper.to_array(i) for i in out.graph.initializer}
    np.testing.assert_array_equal(inits["g"], _gamma().astype(np.float32))
    mul = next(n for n in out.graph.node if n.op_type == "Mul" and n.input[0] == "h")
    assert [n.op_type for n in out.graph.node if "h" in n.input] == ["Mul", "Add"]
    assert next(n for n in out.graph.node if n.output[0] == "y").input[0] == mul.output[0]


@pytest.mark.parametrize(("make", "shape", "floor"), [(ln_model, (4, C), 0.6), (chain_model, (4, C), 0.6)])
def test_int8_error_lower_with_smoothquant(tmp_path: Path, make, shape, floor: float) -> None:
    """On outlier channels, smoothing cuts the all-int8 error (held-out inputs, inside the
    calibrated range so that rounding, not clipping, is measured) below `floor` x the error
    without it."""
    model = make()
    folder = data(tmp_path / "d", shape, n=128)
    x = (0.75 * np.clip(np.random.default_rng(7).normal(0, 1, (32, *shape)), -2.5, 2.5)).astype(np.float32)
    errors = {}
    for name, config in (("plain", Config()), ("auto", sq("auto")), ("0.5", sq(0.5))):
        result = quantize(model, config, table_for(model, folder, config))
        errors[name] = rel_error(run(model, x), run(result.model, x))
    assert errors["auto"] < floor * errors["plain"], errors
    assert errors["0.5"] < floor * errors["plain"], errors


def test_cli_end_to_end_calib_file_and_fused_kernels(cli, tmp_path: Path) -> None:
    model = save(ln_model(), tmp_path / "m.onnx")
    folder = data(tmp_path / "d", (4, C))
    cfg = tmp_path / "sq.yaml"
    cfg.write_text("recovery: [smoothquant]\n")
    out1, out2, out3 = (tmp_path / f"q{i}.onnx" for i in (1, 2, 3))
    first = cli("quantize", model, "-o", out1, "--data", folder, "--config", cfg, "--no-verify", "--json")
    assert first.exit_code == 0, first.stderr
    doc = json.loads(first.stdout)
    layers = {layer["tensor"]: layer for layer in doc["recovery"]["smoothquant"]}
    assert layers["h"]["into"] == "LayerNormalization 'h'" and layers["h"]["alpha"] is not None
    assert layers["h"]["sqnr_after"] > layers["h"]["sqnr_before"]
    assert json.loads(dict((p.key, p.value) for p in onnx.load(str(out1)).metadata_props)["qcli.config"])[
        "recovery"] == {"smoothquant": {"alpha": "auto", "op_types": ["MatMul", "Gemm", "Conv"]}}
    calib = tmp_path / "m.calib.json"
    assert cli("calibrate", model, "--data", folder, "--config", cfg, "-o", calib).exit_code == 0
    assert set(json.loads(calib.read_text())["channels"]) == {"h", "r"}
    again = cli("quantize", model, "-o", out2, "--calib", calib, "--config", cfg, "--no-verify")
    assert again.exit_code == 0, again.stderr
    assert cli("quantize", model, "-o", out3, "--data", folder, "--config", cfg, "--no-verify").exit_code == 0
    assert out1.read_bytes() == out2.read_bytes() == out3.read_bytes()  # file round trip, determinism
    fused = fused_op_counts(out1, tmp_path)
    assert fused["QLinearMatMul"] + fused["MatMulIntegerToFloat"] == 2 and fused["MatMul"] == 0, fused


def test_calibration_without_channel_statistics_is_refused(cli, tmp_path: Path) -> None:
    model = save(ln_model(), tmp_path / "m.onnx")
    folder = data(tmp_path / "d", (4, C), n=8)
    calib = tmp_path / "plain.calib.json"
    assert cli("calibrate", model, "--data", folder, "-o", calib).exit_code == 0
    assert "channels" not in json.loads(calib.read_text())  # files without smoothquant keep their form
    cfg = tmp_path / "sq.yaml"
    cfg.write_text("recovery: [smoothquant]\n")
    result = cli("quantize", model, "-o", tmp_path / "q.onnx", "--calib", calib, "--config", cfg, "--no-verify")
    assert result.exit_code == 2
    assert "no per-channel statistics for SmoothQuant (tensor 'h')" in result.stderr
    assert "calibrate again" in result.stderr


def test_channel_observer_merges_shards_exactly_and_round_trips() -> None:
    rng = np.random.default_rng(4)
    batches = [rng.normal(0, 1, (3, 5, 6)).astype(np.float32) for _ in range(8)]
    whole = ChannelObserver(-1)
    for b in batches:
        whole.update(b, samples=3)
    left, right = ChannelObserver(-1), ChannelObserver(-1)
    for b in batches[:3]:
        left.update(b, samples=3)
    for b in batches[3:]:
        right.update(np.concatenate([b[:1], b[1:]]), samples=3)
    merged = left.merge(right)
    np.testing.assert_array_equal(merged.min, whole.min)
    np.testing.assert_array_equal(merged.max, whole.max)
    np.testing.assert_array_equal(merged.rows, whole.rows)
    assert whole.kept == ROW_SAMPLES
    back = ChannelObserver.from_dict(json.loads(json.dumps(whole.to_dict())))
    np.testing.assert_array_equal(back.rows, whole.rows)
    np.testing.assert_array_equal(back.max, whole.max)


def test_summary_table_says_what_was_smoothed(cli, tmp_path: Path) -> None:
    model = save(ln_model(residual=True), tmp_path / "m.onnx")
    cfg = tmp_path / "sq.yaml"
    cfg.write_text("recovery: {smoothquant: {alpha: 0.5}}\n")
    result = cli("quantize", model, "-o", tmp_path / "q.onnx", "--data", data(tmp_path / "d", (4, C), n=8),
                 "--config", cfg, "--no-verify")
    assert result.exit_code == 0, result.stderr
    assert "SmoothQuant" in result.stdout and "explicit Mul" in result.stdout
    assert "a per-channel 1/s (SmoothQuant, AWQ)" in " ".join(result.stdout.split())  # why the Mul runs in float


def test_verification_and_the_rescue_index_the_smoothed_graph(cli, tmp_path: Path) -> None:
    """The explicit Mul SmoothQuant adds shifts the nodes after it: verification's units came from
    the prepared graph and the plan from the smoothed one (IndexError, exit 3; found by the
    fuzzer). Units now come from the graph the plan indexes."""
    model = save(ln_model(residual=True), tmp_path / "m.onnx")
    cfg = tmp_path / "sq.yaml"
    cfg.write_text("recovery: [{smoothquant: {alpha: 0.5}}]\nverify: {min_cosine: 0.99999, max_latency_ratio: null}\n")
    result = cli("quantize", model, "-o", tmp_path / "q.onnx", "--data", data(tmp_path / "d", (4, C)),
                 "--eval-data", data(tmp_path / "e", (4, C), n=24, seed=5), "--config", cfg, "--json")
    assert result.exit_code in (0, 1), result.stderr
    doc = json.loads(result.stdout)
    assert doc["precision"]["steps"][0]["action"] == "all int8"  # the rescue ran on the smoothed graph
    assert doc["precision"]["steps"][-1]["action"] == "promote top 3"
    # everything promoted, about to be confirmed: the weight-only model (16-bit weights, nothing to
    # smooth) is tried first and written instead
    assert any(n.startswith("weight-only: ") for n in doc["notes"]) and doc["recovery"]["smoothquant"] == []


def test_an_input_with_a_fixed_range_is_not_smoothed(cli, tmp_path: Path) -> None:
    """A YAML `range:` fixes X's range; X / s would need another. Smoothing the input of a node
    with such an override left the new Mul reading X, which nothing calibrated (exit 2 on a
    valid model and config; found by the fuzzer). Such an input now stays unsmoothed."""
    model = save(conv_model(), tmp_path / "m.onnx")
    cfg = tmp_path / "sq.yaml"
    cfg.write_text("recovery: [smoothquant]\noverrides:\n  - match: {op_types: [Conv]}\n    range: [-4, 4]\n")
    doc = cli.json("quantize", model, "-o", tmp_path / "q.onnx", "--data", data(tmp_path / "d", (3, 8, 8)),
                   "--config", cfg, "--no-verify")
    assert doc["recovery"]["smoothquant"] == []


FIXED_RANGE_AFTER_A_SHARED_OUTPUT = """<ir_version: 8, opset_import: ["" : 11]>
g (float[N, 1, 5] x) => (float[N, 1, 4] s, float[N, 2, 4] y) <float[1, 1, 2] w0 = {-0.32, 0.72}, float[1] b0 = {-0.08},
    float[2, 1, 1] w1 = {0.37, -0.16}, float[2] b1 = {-0.51, -0.004}> {
  c = Conv(x, w0, b0)
  s = LogSoftmax(c)
  [last] y = Conv(c, w1, b1)
}"""


def test_the_fuzzers_case_of_a_fixed_range_quantizes(cli, tmp_path: Path) -> None:
    """The fuzzer's smallest case: `c` feeds a float LogSoftmax too, so smoothing it needs an
    explicit Mul, whose input `c` had no statistics ("the calibration has no statistics for
    tensor 'c'", exit 2)."""
    model = save(parse_model(FIXED_RANGE_AFTER_A_SHARED_OUTPUT), tmp_path / "m.onnx")
    folder = normal_folder(tmp_path / "d", 16, x=(1, 1, 5))
    cfg = tmp_path / "sq.yaml"
    cfg.write_text("recovery: [smoothquant]\noverrides:\n  - match: {nodes: [last]}\n    range: [-2, 2]\n")
    doc = cli.json("quantize", model, "-o", tmp_path / "q.onnx", "--data", folder, "--config", cfg, "--no-verify")
    assert doc["recovery"]["smoothquant"] == []
