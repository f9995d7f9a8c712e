"""HQQ (qcli/hqq.py): each group's scale solved on the weights alone, zero points integers, the
decoder it writes fused into MatMulNBits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from conftest import fused_op_counts
from qcli.hqq import rounded
from qcli.plan import WeightPlan
from qcli.qweights import quantized_weight
from qcli.scheme import PerBlock, QuantScheme, dequantize


def heavy_tailed(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Weights with a few large values per block, as trained ones have (Student's t, 4 degrees)."""
    return np.random.default_rng(seed).standard_t(4, shape).astype(np.float32)


def dequantized(weight, wp: WeightPlan) -> np.ndarray:
    q, scale, zero = weight
    if isinstance(wp.scheme.granularity, PerBlock):
        block = wp.scheme.granularity.size
        return dequantize(q, np.repeat(scale, block, axis=wp.axis), np.repeat(zero, block, axis=wp.axis))
    return dequantize(q, scale, zero, wp.axis)


def group_errors(w: np.ndarray, weight, wp: WeightPlan) -> np.ndarray:
    """Each block's (or channel's) summed squared error."""
    error = np.square(w - dequantized(weight, wp))
    if isinstance(wp.scheme.granularity, PerBlock):
        return error.reshape(-1, wp.scheme.granularity.size, w.shape[1]).sum(axis=1)
    return error.sum(axis=0)


@pytest.mark.parametrize(("scheme", "gain"), [
    (QuantScheme.of("uint4", "per_block", False, block_size=32), 0.97),
    (QuantScheme.of("int4", "per_block", True, block_size=32), 0.97),
    (QuantScheme.of("uint4", "per_channel", False), 0.9),
    (QuantScheme.of("int8", "per_channel", True), 0.99),  # 255 steps: rounding leaves little to solve
])
def test_no_group_ends_worse_than_rounding_to_nearest_and_the_weight_gets_closer(scheme: QuantScheme,
                                                                                 gain: float) -> None:
    w = heavy_tailed((256, 64))
    wp = WeightPlan("w", scheme, 0 if isinstance(scheme.granularity, PerBlock) else 1)
    hqq, rtn = rounded(w, wp), quantized_weight(w, wp)
    assert np.array_equal(hqq[2], rtn[2])  # zero points stay integers, RTN's
    assert hqq[0].dtype == rtn[0].dtype and hqq[1].shape == rtn[1].shape
    lo, hi = (-8, 7) if scheme.dtype.name == "int4" else (0, 15) if scheme.dtype.bits == 4 else (-127, 127)
    assert hqq[0].min() >= lo and hqq[0].max() <= hi
    mine, theirs = group_errors(w, hqq, wp), group_errors(w, rtn, wp)
    assert np.all(mine <= theirs)
    assert mine.sum() < gain * theirs.sum()


def test_a_block_that_does_not_divide_its_axis_keeps_rounding_to_nearest() -> None:
    w = heavy_tailed((40, 8))
    wp = WeightPlan("w", QuantScheme.of("uint4", "per_block", False, block_size=32), 0)
    for got, want in zip(rounded(w, wp), quantized_weight(w, wp), strict=True):
        assert np.array_equal(got, want)


@pytest.mark.parametrize("dtype", ["int4", "uint4", "int2"])
@pytest.mark.parametrize("shape", [(), (1,), (1, 1)])
def test_a_one_value_weight_per_tensor(dtype: str, shape: tuple[int, ...]) -> None:
    w = np.full(shape, 0.7, np.float32)
    wp = WeightPlan("w", QuantScheme.of(dtype, "per_tensor", dtype != "uint4"), None)
    for got, want in zip(rounded(w, wp), quantized_weight(w, wp), strict=True):
        assert isinstance(got, np.ndarray) == isinstance(want, np.ndarray) and np.array_equal(got, want)
    assert np.asarray(dequantize(*quantized_weight(w, wp))).ravel()[0] == pytest.approx(0.7, rel=1e-6)


def test_a_large_weight_solved_in_pieces_is_the_whole_ones(monkeypatch) -> None:
    import qcli.hqq

    w = heavy_tailed((512, 96), seed=1)
    wp = WeightPlan("w", QuantScheme.of("uint4", "per_block", False, block_size=32), 0)
    whole = rounded(w, wp)
    monkeypatch.setattr(qcli.hqq, "PIECE", 32 * 96 * 3)  # three blocks' rows a piece, the last shorter
    for got, want in zip(rounded(w, wp), whole, strict=True):
        assert np.array_equal(got, want)


def write_config(path: Path, algorithm: str) -> Path:
    path.write_text("version: 1\nactivations: {dtype: float}\n"
                    f"weights: {{dtype: uint4, symmetric: false, granularity: per_block, block_size: 32, "
                    f"algorithm: {algorithm}}}\nverify: {{max_latency_ratio: null}}\n")
    return path


def test_hqq_writes_the_decoder_onnxruntime_fuses_closer_to_float_than_rtn(cli, tmp_path: Path, tiny: Path) -> None:
    found = {}
    for algorithm in ("rtn", "hqq"):
        found[algorithm] = cli.json("quantize", tiny / "decoder.onnx", "-o", tmp_path / f"{algorithm}.onnx", "--data",
                                    tiny / "text", "--seq-len", "16", "--config",
                                    write_config(tmp_path / f"{algorithm}.yaml", algorithm))
    assert "hqq: 13 weight(s) rounded with scales solved by HQQ (no calibration data)" in found["hqq"]["notes"]
    kl = {a: next(o for o in found[a]["verification"]["outputs"] if o["name"] == "logits")["kl"]
          for a in found}
    assert kl["hqq"] < kl["rtn"]
    counts = fused_op_counts(tmp_path / "hqq.onnx", tmp_path)
    assert counts["MatMulNBits"] == 13 and counts["DequantizeLinear"] == 0
    model = onnx.load(str(tmp_path / "hqq.onnx"))
    zeros = [t for t in model.graph.initializer if t.name.endswith("_zero_point")]
    assert len(zeros) == 13 and all(t.data_type == onnx.TensorProto.UINT4 for t in zeros)
    rtn = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(tmp_path / "rtn.onnx")).graph.initializer}
    assert all(np.array_equal(numpy_helper.to_array(t), rtn[t.name]) for t in zeros)


def test_hqq_needs_no_data_a_calibration_file_will_do(cli, tmp_path: Path, tiny: Path) -> None:
    config = write_config(tmp_path / "h.yaml", "hqq")
    calib = tmp_path / "c.json"
    assert cli("calibrate", tiny / "decoder.onnx", "--data", tiny / "text", "--seq-len", "16", "-o", calib,
               "--config", config).exit_code == 0
    doc = cli.json("quantize", tiny / "decoder.onnx", "--calib", calib, "-o", tmp_path / "q.onnx", "--config", config)
    assert "hqq: 13 weight(s) rounded with scales solved by HQQ (no calibration data)" in doc["notes"]


def test_hqq_does_not_combine_with_recovery_steps_that_change_the_weights(tmp_path: Path) -> None:
    from qcli.config import load_config
    from qcli.errors import ConfigError

    (tmp_path / "c.yaml").write_text("version: 1\nweights: {algorithm: hqq}\nrecovery: [smoothquant]\n")
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path / "c.yaml")
    assert "weights.algorithm hqq does not combine with recovery step smoothquant: drop one of the two" in str(err.value)
