"""HQQ (Badri & Shaji, 2023: half-quadratic quantization): each group's scale moved by HQQ's
half-quadratic steps, which fit the scale to the weight minus the errors an l_p norm (p = 0.7)
lets stand, so that a few large errors do not bend every value's step toward them; no
calibration data (`weights.algorithm: hqq`).

Decisions:
- The variable solved for is the scale; the zero point stays the one rounding to nearest gives
  (an integer). HQQ's own code solves for a float zero point with the scale fixed, which neither
  DequantizeLinear nor onnxruntime's fast MatMulNBits path takes: written as MatMulNBits with
  float zero points, the trained decoder's uint4 blocks decoded 17x slower than with integer
  ones (onnxruntime 1.32, CPU, every accuracy level), and that zero rounded back to an integer
  after each step never moves from rounding's. Solving for the scale keeps the Q/DQ form that
  onnxruntime fuses (docs/guides/formats.md has the figures).
- One step, per group: integers q = clip(round(w / s) + z); the residual r = w - (q - z) s
  shrunk by HQQ's l_p proximal step (shrink_lp, beta growing by kappa each step) to e; the
  scale then the least-squares fit of w - e onto q - z. HQQ's constants (p 0.7, beta 10,
  kappa 1.01, at most 20 steps).
- Each group keeps the scale of least squared error on its weights among the steps, the first
  being rounding to nearest's (no group ends worse than RTN by that measure; the least l_p
  error instead gave the trained decoder's perplexity back a little: benchmarks page). The steps
  stop once no group improves. Pieces along the first axis (as qcli.qweights rounds) keep the
  temporaries in cache.
- Every integer weight of the main graph the plan quantizes statically is solved (any
  granularity; blocks that do not divide their axis keep RTN's, as do dynamic nodes' weights
  and those inside If/Loop bodies), said in a note.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import onnx

from qcli.lazy import tensor_array
from qcli.plan import Plan, WeightPlan
from qcli.qweights import Weight, expander, grouped, pieces, quantized_weight
from qcli.scheme import integer_range

NORM, BETA, KAPPA, STEPS = 0.7, 10.0, 1.01, 20  # HQQ's defaults (its optimize_weights)
PIECE = 1 << 16  # values solved at once


def targets(plan: Plan) -> dict[str, WeightPlan]:
    """The weights HQQ rounds: every integer one of the static plan (dynamic nodes' weights are
    rounded by qcli.dynamic, to nearest)."""
    dynamic = {w.name for dn in plan.dynamic.values() for w in dn.weights}
    return {name: wp for name, wp in plan.weights.items() if not wp.scheme.dtype.is_float and name not in dynamic}


def solve(model: onnx.ModelProto, plan: Plan, names: set[str]) -> Iterator[tuple[str, Weight]]:
    """The weights among `names` rounded by `rounded`, in the graph's order."""
    for t in model.graph.initializer:
        if t.name in names:
            yield t.name, rounded(tensor_array(t).astype(np.float32, copy=False), plan.weights[t.name])


def rounded(values: np.ndarray, wp: WeightPlan) -> Weight:
    """`values`' integers, scales and zero points under `wp`, each group's scale solved by HQQ.

    >>> from qcli.scheme import QuantScheme
    >>> w = np.random.default_rng(0).standard_t(4, (256, 64)).astype(np.float32)  # heavy tails, as trained
    >>> wp = WeightPlan("w", QuantScheme.of("uint4", "per_block", False, 32), 0)
    >>> def error(q, s, z):  # the squared error of the dequantized weights
    ...     blocks = (q.reshape(8, 32, 64) - z[:, None].astype(np.float32)) * s[:, None]
    ...     return float(np.sum(np.square(w - blocks.reshape(w.shape))))
    >>> round(error(*rounded(w, wp)) / error(*quantized_weight(w, wp)), 3)  # against rounding to nearest
    0.944
    """
    q, scale, zero = quantized_weight(values, wp)
    view = grouped(values, wp)
    if view is None:  # a last, shorter block: RTN's
        return q, scale, zero
    groups, reduce = view
    lo, hi = integer_range(wp.scheme.dtype, wp.scheme.symmetric)
    parts = pieces(groups, reduce, PIECE)
    solved = (_solved(groups, scale, zero, reduce, lo, hi) if len(parts) == 1 else
              np.concatenate([_solved(groups[r], scale[r], zero[r], reduce, lo, hi) for r in parts]))
    keep = expander(reduce)
    ints = np.clip(np.rint(groups / keep(solved)) + keep(zero), lo, hi).astype(q.dtype)
    return np.asarray(ints).reshape(values.shape), solved, zero


def _solved(w: np.ndarray, scale: np.ndarray, zero: np.ndarray, reduce: int | tuple[int, ...] | None,
            lo: int, hi: int) -> np.ndarray:
    """The scale of least squared error each group of `w` (over `reduce`) reaches from `scale`
    by HQQ's steps."""
    keep = expander(reduce)
    z = keep(zero).astype(np.float32)
    s = scale.astype(np.float32)
    best, least = s.copy(), np.full(s.shape, np.inf, np.float32)
    beta = BETA
    for _ in range(STEPS):
        c = np.clip(np.rint(w / keep(s)) + z, lo, hi) - z
        residual = w - c * keep(s)
        size = np.asarray(np.abs(residual))  # an array for a one-value weight too (`out=` below)
        error = np.square(size).sum(axis=reduce)
        better = error < least
        if not better.any():
            break
        best, least = np.where(better, s, best), np.where(better, error, least)
        # shrink_lp: the part of the residual the l_p norm lets stand
        size -= np.power(size + 1e-8, NORM - 1) / beta
        np.maximum(size, 0, out=size)
        kept = w - np.copysign(size, residual)
        den = np.square(c).sum(axis=reduce)
        fit = (kept * c).sum(axis=reduce) / np.where(den > 0, den, 1)
        s = np.where((den > 0) & (np.abs(fit) >= np.finfo(np.float32).tiny), fit, s).astype(np.float32)
        beta *= KAPPA
    return best.astype(np.float32)


def notes(plan: Plan, rounded_names: set[str]) -> list[str]:
    """How many weights HQQ solved, and which integer weights keep rounding to nearest."""
    integer = {n for n, wp in plan.weights.items() if not wp.scheme.dtype.is_float}
    left = sorted(integer - rounded_names)
    said = [f"hqq: {len(rounded_names)} weight(s) rounded with scales solved by HQQ (no calibration data)"]
    if left:
        shown = ", ".join(left[:5]) + (f" and {len(left) - 5} more" if len(left) > 5 else "")
        said.append(f"hqq: rounded to nearest instead (dynamic nodes' weights, weights inside If/Loop bodies): "
                    f"{shown}")
    return said
