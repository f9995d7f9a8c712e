"""Recovery steps `seq_mse` and `adaround` (qcli.recovery.rounding, qcli.adaround): weights
rounded for their layer's output on the Gram matrix of its inputs; never worse than rounding to
nearest on the calibration data, better on inputs it never saw; refused where they cannot run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from test_gptq_conv import smooth_folder, two_convs

from qcli import adaround
from qcli.gptq import Gram
from qcli.plan import WeightPlan
from qcli.qweights import quantized_weight
from qcli.recovery.rounding import Rounding
from qcli.scheme import QuantScheme, dequantize

INT8 = QuantScheme.of("int8", "per_channel", True)
INT4 = QuantScheme.of("int4", "per_channel", True)


def correlated(rows: int, k: int, seed: int) -> np.ndarray:
    """Inputs whose features move together (a few shared factors), as activations do."""
    mix = np.random.default_rng(0).normal(size=(6, k))  # the same factors for every draw
    rng = np.random.default_rng(seed)
    return np.maximum(rng.normal(size=(rows, 6)) @ mix + 0.3 * rng.normal(size=(rows, k)), 0)


def layer() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A MatMul weight [K, N] (per output column N) with heavy tails, as trained weights have,
    its calibration inputs and held-out inputs."""
    rng = np.random.default_rng(0)
    w = (rng.standard_t(3, size=(48, 16)) * np.linspace(0.05, 1.0, 16)).astype(np.float32)
    return w, correlated(2000, 48, 1), correlated(2000, 48, 2)


def output_error(w: np.ndarray, weight, x: np.ndarray) -> float:
    deq = dequantize(weight[0], weight[1].reshape(1, -1), weight[2].reshape(1, -1))
    return float(np.mean((x @ deq - x @ w) ** 2))


@pytest.mark.parametrize(("rounding", "scheme"), [(Rounding(candidates=20), INT4), (Rounding(iterations=500), INT8),
                                                  (Rounding(candidates=20, iterations=500), INT4)])
def test_each_step_moves_held_out_outputs_less_than_rounding_to_nearest(rounding: Rounding, scheme) -> None:
    """seq_mse clips int4's scales (int8's 255 steps leave clipping little to gain), AdaRound
    rounds int8 down or up: both move the layer's outputs on held-out inputs less than RTN."""
    w, calib, held_out = layer()
    wp = WeightPlan("w", scheme, 1)
    gram = Gram((calib.T @ calib).astype(np.float32), len(calib))
    weight, sqnr = rounding.weight(w, wp, gram, conv=False)
    rtn = quantized_weight(w, wp)
    assert weight[0].shape == w.shape
    assert sqnr is not None and sqnr[1] > sqnr[0] + 0.5  # dB, on the calibration inputs
    assert sqnr[2] == ""
    assert output_error(w, weight, held_out) < 0.9 * output_error(w, rtn, held_out)
    if rounding.candidates is None:  # the full range's scale: every value down or up from w / s
        step = w / rtn[1].reshape(1, -1)
        assert np.all((weight[0] == np.floor(step)) | (weight[0] == np.floor(step) + 1))
        assert np.array_equal(weight[1], rtn[1])
    else:  # scales clipped from the full range's, never widened
        assert np.all(np.abs(weight[1]) <= np.abs(rtn[1])) and np.any(np.abs(weight[1]) < np.abs(rtn[1]))


def test_seq_mse_keeps_the_full_range_where_clipping_does_not_pay() -> None:
    """int8 over 48 inputs: no clipped range's output error is below the full range's, which
    comes first and wins ties: the weight is RTN's, byte for byte."""
    w, calib, _ = layer()
    wp = WeightPlan("w", INT8, 1)
    weight, sqnr = Rounding(candidates=20).weight(w, wp, Gram((calib.T @ calib).astype(np.float32), len(calib)),
                                                  conv=False)
    rtn = quantized_weight(w, wp)
    assert all(np.array_equal(a, b) for a, b in zip(weight, rtn, strict=True))
    assert sqnr is not None and sqnr[0] == sqnr[1]


def test_adaround_past_its_budget_keeps_nearest() -> None:
    """A head of 8000 x 1024 would cost 17 TFLOP at 1000 iterations: rounded to nearest, said."""
    w = np.random.default_rng(5).normal(size=(1024, 8000)).astype(np.float32)
    wp = WeightPlan("w", INT8, 1)
    weight, sqnr = Rounding(iterations=1000).weight(w, wp, Gram(np.eye(1024, dtype=np.float32) * 5000, 5000),
                                                    conv=False)
    assert sqnr is not None and sqnr[2] == "past AdaRound's budget"
    assert np.array_equal(weight[0], quantized_weight(w, wp)[0])


def test_a_layer_read_once_per_sample_keeps_nearest() -> None:
    """A squeeze-excite layer's Gram matrix from 32 pooled rows over 48 inputs: of low rank, so
    neither step fits its choice to it; rounded to nearest, said."""
    w, calib, _ = layer()
    wp = WeightPlan("w", INT4, 1)
    rows = calib[:32]
    weight, sqnr = Rounding(candidates=20, iterations=300).weight(
        w, wp, Gram((rows.T @ rows).astype(np.float32), len(rows)), conv=False)
    assert all(np.array_equal(a, b) for a, b in zip(weight, quantized_weight(w, wp), strict=True))
    assert sqnr is not None and sqnr[0] == sqnr[1] and sqnr[2] == "too few rows of data"


def test_adaround_keeps_nearest_where_learning_does_not_help() -> None:
    """Uncorrelated inputs of equal energy: each value's own error is the output's, so nearest
    rounding is best and every row keeps it (the output check per row)."""
    rng = np.random.default_rng(3)
    w = rng.normal(size=(1, 8, 32))
    s = np.abs(w).max(axis=2, keepdims=True) / 127 * np.ones_like(w)
    z = np.zeros_like(w)
    ints = adaround.rounded(w, s, z, np.eye(32)[None], -128, 127, iterations=200)
    assert np.array_equal(ints, adaround.nearest(w, s, z, -128, 127))


def test_a_depthwise_conv_rounds_each_group_on_its_own_matrix() -> None:
    rng = np.random.default_rng(4)
    w = rng.normal(size=(4, 1, 3, 3)).astype(np.float32)
    grams = np.stack([np.cov(correlated(500, 9, g).T) + np.eye(9) for g in range(4)]).astype(np.float32)
    weight, sqnr = Rounding(candidates=10, iterations=300).weight(w, WeightPlan("w", INT8, 0), Gram(grams * 500, 500),
                                                                  conv=True)
    assert weight[0].shape == w.shape and weight[1].shape == (4,)
    assert sqnr is not None and sqnr[1] >= sqnr[0]


def config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


def test_quantize_rounds_every_conv_reports_sqnr_and_writes_the_same_bytes_twice(cli, tmp_path: Path) -> None:
    """Weight-only int8 on two convolutions over smooth maps: both weights rounded by seq_mse and
    AdaRound, each layer's SQNR up in the summary, held-out output SQNR above round to
    nearest's, and the same bytes from a second run."""
    model, data = two_convs(tmp_path), smooth_folder(tmp_path / "calib", 16, 0)
    held_out = smooth_folder(tmp_path / "eval", 8, 1)
    noise = {}
    for name, steps in (("rtn", ""), ("ada", "recovery: [seq_mse, {adaround: {iterations: 300}}]\n"),
                        ("again", "recovery: [seq_mse, {adaround: {iterations: 300}}]\n")):
        out = tmp_path / f"{name}.onnx"
        result = cli("quantize", model, "-o", out, "--data", data, "--no-verify", "--json",
                     "--config", config(tmp_path, "activations: {dtype: float}\n" + steps))
        assert result.exit_code == 0, result.stderr
        doc = json.loads(result.stdout)
        if steps:
            done = doc["recovery"]["adaround"]
            assert done["steps"] == ["seq_mse", "adaround"] and done["weights"] == 2
            assert all(after > before for before, after in done["sqnr_db"].values()), done
            assert "seq_mse, adaround: 2 weight(s) rounded by the Gram matrices of their layers' inputs" in doc["notes"]
        report = cli("analyze", model, out, "--data", held_out, "--json")
        noise[name] = json.loads(report.stdout)["fidelity"][0]["sqnr_db"]
    assert noise["ada"] > noise["rtn"] + 1.0  # dB
    assert (tmp_path / "ada.onnx").read_bytes() == (tmp_path / "again.onnx").read_bytes()
    assert json.loads(onnx.load(tmp_path / "ada.onnx").metadata_props[1].value)["recovery"] == {
        "seq_mse": {"candidates": 20}, "adaround": {"iterations": 300, "reg_param": 0.01}}


def test_a_calibration_file_without_data_is_refused(cli, tmp_path: Path) -> None:
    model, data = two_convs(tmp_path), smooth_folder(tmp_path / "calib", 4, 0)
    calib = tmp_path / "c.json"
    assert cli("calibrate", model, "--data", data, "-o", calib).exit_code == 0
    result = cli("quantize", model, "-o", tmp_path / "q.onnx", "--calib", calib,
                 "--config", config(tmp_path, "recovery: [adaround]\n"))
    assert result.exit_code == 2
    assert result.stderr == (
        "error: recovery step 'adaround' needs --data DIR: it reads the Gram matrices of the layers' inputs on the "
        "calibration samples, which a calibration file does not hold\n"
        "hint: give --data DIR instead of --calib FILE, or drop adaround from recovery:\n")


@pytest.mark.parametrize(("text", "message"), [
    ("recovery: [smoothquant, adaround]\n",
     ":1: recovery: Value error, recovery step adaround does not combine with smoothquant: drop one of the two"),
    ("weights: {algorithm: gptq}\nrecovery: [seq_mse]\n",
     ": (top level): Value error, weights.algorithm gptq does not combine with recovery step seq_mse: drop one of the two"),
    ("recovery:\n  adaround: {iterations: 5}\n",
     ":2: recovery.adaround.iterations: Input should be greater than or equal to 10 (got 5)"),
    ("recovery: [adaroud]\n", ":1: recovery: Value error, unknown recovery step 'adaroud': did you mean 'adaround'?"),
])
def test_bad_rounding_configs_are_refused_with_file_line_and_key(cli, tmp_path: Path, text: str, message: str) -> None:
    result = cli("config", "validate", config(tmp_path, text))
    assert result.exit_code == 2, result.stdout
    assert result.stderr.startswith(f"error: {tmp_path / 'c.yaml'}{message}"), result.stderr


def test_the_rescue_s_weight_only_model_takes_adaround_s_int8_weights_where_rtn_needs_16_bits(cli,
                                                                                         tmp_path: Path) -> None:
    """A cosine floor between the held-out errors of int8 weights rounded to nearest and by
    seq_mse and AdaRound (weight-only, each measured first): the rescue's weight-only model
    writes 16-bit weights rounded to nearest, and int8 ones with the two steps on, said in the
    note and reproduced by the precision config."""
    model, calib, held = two_convs(tmp_path), smooth_folder(tmp_path / "calib", 48, 0), smooth_folder(
        tmp_path / "held", 32, 1)
    steps = {"rtn": "", "ada": "recovery: [seq_mse, adaround]\n"}
    error = {}
    for name, text in steps.items():
        assert cli("quantize", model, "-o", tmp_path / f"{name}.onnx", "--data", calib, "--no-verify", "--config",
                   config(tmp_path, "activations: {dtype: float}\n" + text)).exit_code == 0
        report = json.loads(cli("analyze", model, tmp_path / f"{name}.onnx", "--data", held, "--json").stdout)
        error[name] = 1.0 - report["fidelity"][0]["cosine"]
    assert error["ada"] < 0.5 * error["rtn"]
    floors = f"verify: {{min_cosine: {1.0 - (error['ada'] * error['rtn']) ** 0.5:.8f}, outputs: {{y: cosine}}}}\n"
    for name, text in steps.items():
        result = cli("quantize", model, "-o", tmp_path / f"q_{name}.onnx", "--data", calib, "--json",
                     "--config", config(tmp_path, floors + text))
        assert result.exit_code == 0, result.stderr
        note = next(n for n in json.loads(result.stdout)["notes"] if n.startswith("weight-only:"))
        weights = {t.name: t.data_type for t in onnx.load(str(tmp_path / f"q_{name}.onnx")).graph.initializer
                   if t.name.endswith("_quantized")}
        wanted = onnx.TensorProto.INT8 if text else onnx.TensorProto.INT16
        assert sorted(weights.values()) == [wanted] * 2, weights
        assert ("int8 weights rounded by seq_mse + adaround and float activations" if text
                else "the model with int16 weights and float activations") in note, note
    assert "adaround:" in (tmp_path / "q_ada.precision.yaml").read_text()


def test_per_block_int4_weights_are_rounded_block_by_block() -> None:
    """int4 blocks of 16 along a MatMul's reduction axis (a language model's weights): seq_mse
    clips each block on its diagonal block of H, AdaRound rounds within them; held-out output
    error below RTN's, the scales one per block."""
    w, calib, held_out = layer()
    wp = WeightPlan("w", QuantScheme.of("int4", "per_block", True, block_size=16), 0)
    weight, sqnr = Rounding(candidates=20, iterations=300).weight(
        w, wp, Gram((calib.T @ calib).astype(np.float32), len(calib)), conv=False)
    rtn = quantized_weight(w, wp)
    assert weight[1].shape == rtn[1].shape == (3, 16)
    assert sqnr is not None and sqnr[1] > sqnr[0]

    def error(q) -> float:
        deq = dequantize(q[0], np.repeat(q[1], 16, axis=0), np.repeat(q[2], 16, axis=0))
        return float(np.mean((held_out @ deq - held_out @ w) ** 2))

    assert error(weight) < 0.8 * error(rtn)
