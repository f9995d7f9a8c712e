"""Empirical bias correction (`recovery: [bias_correction]`): the measured shift against a
numpy/onnxruntime reference, the int8 error it removes on a weight whose rounding error has a
nonzero mean, the fused kernels unchanged, determinism, consistency with promotions, and the
refusal of a calibration file without data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from qcli.config import Config
from qcli.quantize import prepare_for, quantize
from qcli.verify import quantize_checked
from tests.conftest import (
    fused_op_counts,
    normal_folder,
    parse_model,
    quantize_with,
    save,
    sqnr_db,
    tensor_text,
    write_npz,
)


def _biased_weights() -> np.ndarray:
    """A Conv weight [4, 3, 3, 3] on the int8 grid of step 0.1 (one outlier of 12.7 fixes a
    per-tensor scale of 0.1) plus an offset per output channel (+0.04, -0.04, +0.03, -0.02):
    rounding takes it all back, so channel c's int8 output is off by offset_c x sum(x)."""
    rng = np.random.default_rng(5)
    w = 0.1 * rng.integers(-4, 5, (4, 3, 3, 3)).astype(np.float64)
    w += np.array([0.04, -0.04, 0.03, -0.02])[:, None, None, None]
    w[0, 0, 0, 0] = 12.7
    return w


MODEL = """
<ir_version: 8, opset_import: ["" : 17]>
net (float[N, 3, 8, 8] x) => (float[N, 4, 8, 8] y) <{W}> {{
    y = Conv <pads = [1, 1, 1, 1]> (x, w)
}}
"""


@pytest.fixture
def biased(tmp_path: Path) -> tuple[Path, Path, np.ndarray]:
    model = save(parse_model(MODEL.format(W=tensor_text("w", _biased_weights()))), tmp_path / "biased.onnx")
    rng = np.random.default_rng(2)
    folder = tmp_path / "data"
    folder.mkdir()
    for i in range(24):
        write_npz(folder / f"{i:03d}.npz", x=rng.uniform(0, 1, (3, 8, 8)).astype(np.float32))
    return model, folder, rng.uniform(0, 1, (16, 3, 8, 8)).astype(np.float32)


def _run(model: Path | onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    source = str(model) if isinstance(model, Path) else model.SerializeToString()
    return ort.InferenceSession(source, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def _config(text: str = "") -> Config:
    return Config.model_validate({"weights": {"granularity": "per_tensor"}, "verify": {"enabled": False},
                                  "recovery": ["bias_correction"], **({"exclude": {"op_types": [text]}} if text else {})})


def _inits(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def test_measured_shift_matches_a_reference(biased) -> None:
    path, data, _ = biased
    model = onnx.load(str(path))
    outcome = quantize_checked(model, _config(), data=data)
    shifts = outcome.table.bias_shifts
    assert shifts is not None and list(shifts) == ["y"]
    # reference: the int8 weight's error applied to the int8 model's (dequantized) inputs, averaged
    inits = _inits(outcome.result.model)
    wq = (inits["w_quantized"].astype(np.float64) - inits["w_zero_point"]) * inits["w_scale"]
    dw = (wq - _inits(model)["w"]).astype(np.float32)
    x = np.stack([np.load(f)["x"] for f in sorted(data.glob("*.npz"))])
    scale, zero = inits["x_scale"], inits["x_zero_point"].astype(np.float32)
    xq = ((np.clip(np.round(x / scale) + zero, 0, 255) - zero) * scale).astype(np.float32)
    error_model = parse_model(MODEL.format(W=tensor_text("w", dw)))
    expected = _run(error_model, xq).mean(axis=(0, 2, 3))
    np.testing.assert_allclose(shifts["y"].values, expected, atol=2e-3)
    assert np.abs(expected).min() > 0.1  # a shift worth correcting in every channel
    assert shifts["y"].sqnr_after > shifts["y"].sqnr_before + 3






def test_bias_correction_cuts_int8_error_end_to_end(cli, tmp_path: Path, biased) -> None:
    model, data, held = biased
    per_tensor = "weights: {granularity: per_tensor}\n"
    plain, _ = quantize_with(cli, tmp_path, model, data, "plain", per_tensor)
    fixed, doc = quantize_with(cli, tmp_path, model, data, "fixed", per_tensor + "recovery: [bias_correction]\n")
    ref = _run(model, held)
    before, after = sqnr_db(ref, _run(plain, held)), sqnr_db(ref, _run(fixed, held))
    assert after > before + 6, (before, after)  # measured: 17.7 dB -> 29.6 dB
    done = doc["recovery"]["bias_correction"]
    assert done["nodes"] == 1 and done["largest_shift"]["node"] == "y"
    assert abs(done["largest_shift"]["value"]) > 0.1
    assert done["sqnr_db"]["y"][1] > done["sqnr_db"]["y"][0]
    assert any(n.startswith("bias correction: corrected 1 node(s); largest shift") for n in doc["notes"])
    # the zero bias the node was given now carries the correction, as an int32 bias of the fused Conv
    assert fused_op_counts(fixed, tmp_path) == fused_op_counts(plain, tmp_path)
    assert fused_op_counts(fixed, tmp_path)["QLinearConv"] == 1
    meta = {p.key: p.value for p in onnx.load(str(fixed)).metadata_props}
    assert '"recovery":{"bias_correction":{"op_types":["Conv","Gemm","MatMul"]}}' in meta["qcli.config"]


def test_bias_corrected_model_is_deterministic(cli, tmp_path: Path, biased) -> None:
    model, data, _ = biased
    a, _ = quantize_with(cli, tmp_path, model, data, "a", "recovery: [bias_correction]\n")
    b, _ = quantize_with(cli, tmp_path, model, data, "b", "recovery: [bias_correction]\n")
    assert a.read_bytes() == b.read_bytes()


def test_a_node_no_longer_quantized_keeps_its_float_bias(biased) -> None:
    """A rebuild (rescue, auto-precision) applies the shifts measured once only to nodes still
    quantized under the schemes they were measured with."""
    path, data, _ = biased
    model = onnx.load(str(path))
    table = quantize_checked(model, _config(), data=data).table
    floated = Config.model_validate({**_config().model_dump(exclude_unset=True), "exclude": {"op_types": ["Conv"]}})
    out = quantize(model, floated, table, prepared=prepare_for(model, floated))
    assert "bias_correction" not in out.recovery or out.recovery["bias_correction"]["nodes"] == 0
    np.testing.assert_array_equal(_inits(out.model)["y/bias"], np.zeros(4, np.float32))
    wider = Config.model_validate({**_config().model_dump(exclude_unset=True), "activations": {"dtype": "uint16"}})
    assert quantize(model, wider, table, prepared=prepare_for(model, wider)).recovery["bias_correction"]["nodes"] == 0


def test_calibration_file_without_data_is_refused(cli, tmp_path: Path, biased) -> None:
    model, data, _ = biased
    calib = tmp_path / "c.json"
    assert cli("calibrate", model, "--data", data, "-o", calib).exit_code == 0
    (tmp_path / "bc.yaml").write_text("recovery: [bias_correction]\n")
    out = tmp_path / "q.onnx"
    result = cli("quantize", model, "-o", out, "--calib", calib, "--config", tmp_path / "bc.yaml")
    assert result.exit_code == 2, result.stdout
    assert result.stderr == (
        "error: recovery step 'bias_correction' needs --data DIR: it measures the int8 model's output shift on "
        "the calibration samples, which a calibration file does not hold\n"
        "hint: give --data DIR instead of --calib FILE, or drop bias_correction from recovery:\n"
    )
    assert not out.exists()


def test_bias_correction_after_smoothquant_indexes_the_smoothed_graph(cli, tmp_path: Path) -> None:
    """SmoothQuant's explicit Mul shifts the nodes after it: bias correction's targets came from
    the prepared graph with the smoothed graph's plan (IndexError, exit 3; found by the fuzzer)."""
    model = save(parse_model("""<ir_version: 8, opset_import: ["" : 18]>
        g (float[2, 6, 3, 1] x) => (float[2, 6, 3, 1] r, float[2, 6, 3, 1] m, float[2, 4, 3, 1] c)
            <float[1, 1] w = {0.26}, float[6, 2, 1, 1] wc = {0.15, -0.17, -0.19, 0.57, -0.15, 0.53, -0.11, 0.39,
             0.14, 0.16, -0.68, 0.23}, float[4] b = {-0.23, -0.74, 0.18, 0.28}> {
            r = Relu (x)
            m = MatMul (r, w)
            c = ConvTranspose <group = 2, kernel_shape = [1, 1]> (r, wc, b)
        }"""), tmp_path / "m.onnx")
    folder = normal_folder(tmp_path / "d", 12, x=(2, 6, 3, 1))
    config = tmp_path / "c.yaml"
    config.write_text("recovery: [{smoothquant: {alpha: 0.5}}, bias_correction]\n")
    result = cli("quantize", model, "-o", tmp_path / "q.onnx", "--data", folder, "--config", config, "--no-verify")
    assert result.exit_code == 0, result.stderr


def test_a_scalar_bias_broadcast_over_channels_is_left_uncorrected(cli, tmp_path: Path) -> None:
    """Gemm's C may be a scalar broadcast over 4 output channels: a per-channel correction does
    not fit it (ValueError reshaping 4 shifts into shape (), exit 3; found by the fuzzer). Such a
    node is noted as having no bias of its own, and the model is written."""
    model = save(parse_model("""<ir_version: 8, opset_import: ["" : 21]>
        g (float[N, 6] x) => (float[N, 4] y) <float[4, 6] w = {-1.06, 1.42, 0.15, -0.43, 0.21, -0.36, -0.8, -0.13,
         0.43, -0.03, -1.74, 0.11, 0.21, -0.01, -0.05, -0.83, -0.18, -0.65, -0.07, 0.64, 0.67, -1.0, 0.8, -0.48},
         float c = {-0.3}> {
            [fc] y = Gemm <transB = 1> (x, w, c)
        }"""), tmp_path / "m.onnx")
    folder = normal_folder(tmp_path / "d", 8, x=(1, 6))
    config = tmp_path / "c.yaml"
    config.write_text("recovery: [bias_correction]\n")
    doc = cli.json("quantize", model, "-o", tmp_path / "q.onnx", "--data", folder, "--config", config, "--no-verify")
    assert any(n.startswith("bias correction: 1 node(s) have no bias of their own") and n.endswith(": fc")
               for n in doc["notes"]), doc["notes"]
