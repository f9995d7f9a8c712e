"""AWQ (qcli/awq.py): its statistics, its factors and clipping, and the decoder it writes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from conftest import fused_op_counts
from decoders import int4_blocks
from qcli.awq import ALPHAS, Change, Moments, _add, _error, factors, rounded
from qcli.plan import WeightPlan
from qcli.qweights import quantized_weight
from qcli.scheme import QuantScheme, dequantize

INT4_BLOCKS = QuantScheme.of("int4", "per_block", True, block_size=32)


def moments_of(x: np.ndarray, block: int) -> Moments:
    found: dict[str, Moments] = {}
    for part in np.array_split(x, 3):  # batches: the sums are the whole data's
        _add(found, "x", part.astype(np.float32), block)
    return found["x"]


def test_moments_hold_the_mean_abs_and_the_gram_blocks_of_x_over_s() -> None:
    x = np.random.default_rng(0).normal(size=(300, 80))  # 80 channels: blocks of 32 pad the last
    m = moments_of(x, 32)
    assert m.rows == 300 and np.allclose(m.mean_abs(), np.abs(x).mean(0))
    s = np.linspace(0.5, 2.0, 80)
    gram = (x / s).T @ (x / s) / 300
    for size in (32, 16):
        blocks = m.blocks(size, s)
        assert blocks.shape == (-(-80 // size), size, size)
        for g in range(blocks.shape[0]):
            width = min(size, 80 - g * size)
            want = gram[g * size:g * size + width, g * size:g * size + width]
            assert np.allclose(blocks[g, :width, :width], want, rtol=1e-5, atol=1e-5)


def test_factors_are_normalized_powers_of_the_mean_abs() -> None:
    mean = np.array([8.0, 2.0, 0.5, 0.0])
    assert np.allclose(factors(mean, 0.0), [1, 1, 1, 1])
    s = factors(mean, 0.5)
    assert s[3] == 1.0 and np.isclose(s[:3].max() * s[:3].min(), 1.0) and np.allclose(s[0] / s[1], 2.0)


def output_error(x: np.ndarray, w: np.ndarray, weight, s: np.ndarray) -> float:
    q, scale, zero = weight
    deq = dequantize(q, np.repeat(scale, 32, axis=0), np.repeat(zero, 32, axis=0)) / s[:, None]
    return float(np.mean((x @ w - x @ deq) ** 2))


def test_awq_moves_a_layers_output_on_unseen_rows_less_than_rounding_to_nearest() -> None:
    """Hidden states with a few channels far larger than the rest (as LLMs' are): scaling those
    inputs' weights up gives them finer steps; the search picks a factor > 0 and the error on
    rows it never saw drops."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(4096, 128)) * np.where(np.arange(128) % 16 == 3, 20.0, 1.0)
    w = rng.normal(size=(128, 64)).astype(np.float32)
    wp = WeightPlan("w", INT4_BLOCKS, 0)
    seen, unseen = x[:2048], x[2048:]
    m = moments_of(seen, 32)
    errors = [_error([(w, 0, wp)], m, factors(m.mean_abs(), a)) for a in ALPHAS]
    best = int(np.argmin(errors))
    assert best > 0 and errors[best] < 0.8 * errors[0]
    s = factors(m.mean_abs(), ALPHAS[best])
    awq = rounded(w, wp, Change(((0, s),), "x", s), {"x": m})
    rtn = quantized_weight(w, wp)
    assert output_error(unseen, w, awq, s) < 0.6 * output_error(unseen, w, rtn, np.ones(128))
    unclipped = rounded(w, wp, Change(((0, s),)), {"x": m})
    # ranges clipped, never widened (in magnitude: a block's scale may be negative, qcli.scheme.full_range)
    assert np.all(np.abs(awq[1]) <= np.abs(unclipped[1])) and np.any(np.abs(awq[1]) < np.abs(unclipped[1]))
    assert output_error(unseen, w, awq, s) <= output_error(unseen, w, unclipped, s)


def test_awq_decoder_scales_into_layer_norms_and_explicit_muls_and_runs_as_matmulnbits(cli, tmp_path: Path,
                                                                                       tiny: Path) -> None:
    found = {a: int4_blocks(cli, tmp_path, tiny, a, f"algorithm: {a}") for a in ("rtn", "awq")}
    layers = {layer["tensor"]: layer for layer in found["awq"]["recovery"]["awq"]}
    scaled = sum(bool(layer["alpha"]) for layer in layers.values())  # none or 0: rounding to nearest was best
    assert scaled >= 7 and f"awq: {scaled} of 9 activation(s) scaled, 13 weight(s) scaled or clipped" in found["awq"]["notes"]
    assert layers["layers.0/ln1"]["into"] == "LayerNormalization '/layers.0/ln1/LayerNormalization'"
    assert layers["layers.0/gelu"]["into"] == "explicit Mul"
    assert all(layer["gain_db"] >= 0 for layer in layers.values() if layer["alpha"])  # never worse than RTN
    agreement = {a: next(o for o in found[a]["verification"]["outputs"] if o["name"] == "logits")["token_agreement"]
                 for a in found}
    assert agreement["awq"] > agreement["rtn"]
    original = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(tiny / "decoder.onnx")).graph.initializer}
    written = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(tmp_path / "awq.onnx")).graph.initializer}
    ln = [n for n in original if n.startswith("layers.0.ln1") or "ln1" in n]
    assert ln and any(not np.array_equal(original[n], written[n]) for n in ln if n in written)
    counts = fused_op_counts(tmp_path / "awq.onnx", tmp_path)
    assert counts["MatMulNBits"] == 13 and counts["MatMul"] == fused_op_counts(tmp_path / "rtn.onnx", tmp_path)["MatMul"]
    again = int4_blocks(cli, tmp_path, tiny, "again", "algorithm: awq")
    assert (tmp_path / "again.onnx").read_bytes() == (tmp_path / "awq.onnx").read_bytes()
    assert again["recovery"] == found["awq"]["recovery"]
