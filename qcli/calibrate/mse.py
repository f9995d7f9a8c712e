"""Expected-error (MSE) calibration: the range whose quantizer has the least expected squared
quantize->dequantize error on the histogram, clipping error included.

The error of a quantizer is computed exactly for values spread uniformly within each bin
(`QuantizationError`, in closed form, for many quantizers at once); `mse_range` searches the
clipping fractions of the observed range for the smallest one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from qcli.calibrate.grid import GridHistogram
from qcli.calibrate.ranges import Range, RangeStats, abs_max, require_data
from qcli.scheme import QuantDtype


class QuantizationError:
    """Expected squared quantize->dequantize error of a histogram, for many quantizers at once.

    `err(lo, hi, step)[c]` is the total over all values of E[(x - Q_c(x))**2], where quantizer c
    rounds to multiples of `step[c]` and clips to `[lo[c], hi[c]]` (multiples of the step), and
    the values of each bin are taken as spread uniformly over it. In closed form per bin [a, b):
      * rounding, on the part of the bin inside [lo, hi]: H(b) - H(a), where
        H(x) = n*step**3/12 + (r**3 + step**3/8)/3, n = round(x/step), r = x - n*step,
        is an antiderivative of (x - Q(x))**2 (continuous at the half-steps, where n jumps);
      * clipping, above hi: integral of (x - hi)**2 = ((b - hi)**3 - (a - hi)**3)/3; for whole
        bins that is width * ((centre - hi)**2 + width**2/12), a sum of prefix sums of
        count, count*centre, count*centre**2 (one lookup per candidate); below lo likewise.
    Only the rounding term needs a (candidates x edges) matrix; it is built over the edges
    inside each block of candidates' ranges (see `rounding`).

    >>> h = GridHistogram(exponent=0, first=0, counts=np.array([6, 0, 3]))  # [0,1): 6, [2,3): 3
    >>> err = QuantizationError(h)
    >>> err(np.array([-4.0]), np.array([4.0]), np.array([1.0]))  # 9 values, each 1/12
    array([0.75])
    >>> err(np.array([-1.0]), np.array([1.0]), np.array([1.0]))  # [2,3) clipped to 1: 3 * 7/3
    array([7.5])
    """

    #: Candidates evaluated together in `rounding` (fewer: less work outside each one's range;
    #: more: less numpy overhead per call).
    ROWS = 16

    def __init__(self, h: GridHistogram):
        nonzero = np.flatnonzero(h.counts)
        self.width = h.width
        self.lower = (h.first + nonzero).astype(np.float64) * self.width
        self.upper = self.lower + self.width
        self.counts = h.counts[nonzero].astype(np.float64)
        centre = self.lower + self.width / 2
        zero = np.zeros(1)
        self._s0 = np.concatenate([zero, np.cumsum(self.counts)])
        self._s1 = np.concatenate([zero, np.cumsum(self.counts * centre)])
        self._s2 = np.concatenate([zero, np.cumsum(self.counts * centre * centre)])
        # For `rounding`: the grid edges from the first to the last nonzero bin, and the weight
        # differences d_k = w_(k-1) - w_k of the bins on either side of edge k (w = 0 outside).
        span = np.arange(nonzero[0], nonzero[-1] + 2) if len(nonzero) else np.zeros(0, dtype=np.int64)
        self.edges = (h.first + span).astype(np.float64) * self.width
        weights = np.zeros(len(span) + 1)
        if len(nonzero):
            weights[1:-1] = h.counts[nonzero[0] : nonzero[-1] + 1] / (3 * self.width)
        self._weights = weights  # weights[k] = w_(k-1)
        self._weight_steps = weights[:-1] - weights[1:]

    def __call__(self, lo: np.ndarray, hi: np.ndarray, step: np.ndarray) -> np.ndarray:
        return self.rounding(lo, hi, step) + self.clipping(lo, hi)

    def rounding(self, lo: np.ndarray, hi: np.ndarray, step: np.ndarray) -> np.ndarray:
        """Sum over bins of w_j * 3 * (H(b_j) - H(a_j)), (a_j, b_j) bin j's edges clipped to
        [lo, hi], w_j = count / (3 * width). Consecutive bins share an edge, so this is
        sum_k 3H(clip(e_k)) * (w_(k-1) - w_k) over the edges e_k: one H per edge instead of
        two per bin. Edges below lo all clip to lo (their weight differences add up to
        -w_(k0-1), k0 the first edge kept), likewise above hi; so each block of candidates
        (ordered by how many edges fall inside their range) evaluates only the edges inside
        the block's widest range, and a clipping threshold far below an outlier costs few."""
        edges, weights, steps = self.edges, self._weights, self._weight_steps
        out = np.zeros(len(lo))
        if len(edges) == 0:
            return out
        inside_from = np.searchsorted(edges, lo, side="left")
        inside_to = np.searchsorted(edges, hi, side="right")
        order = np.argsort(inside_to - inside_from, kind="stable")
        rows = self.ROWS
        for r in range(0, len(lo), rows):
            block = order[r : r + rows]
            k0, k1 = int(inside_from[block].min()), max(int(inside_to[block].max()), 0)
            low, high, d = lo[block, None], hi[block, None], step[block, None]
            # 3H(x) = n * step**3 / 4 + r**3, n = round(x / step), r = x - n * step.
            # In place, in the same order of operations (the same bits) as the formula.
            x = np.empty((len(block), 2 + max(k1 - k0, 0)))
            x[:, :1], x[:, 1:2] = low, high
            if k1 > k0:
                inner = x[:, 2:]
                np.maximum(edges[k0:k1], low, out=inner)
                np.minimum(inner, high, out=inner)
            n = np.multiply(x, 1.0 / d)
            np.rint(n, out=n)
            t = np.multiply(n, d)
            x -= t
            g = np.multiply(n, d * d * d / 4, out=n)
            np.multiply(x, x, out=t)
            t *= x
            g += t
            total = g[:, 1] * weights[k1] - g[:, 0] * weights[k0]
            if k1 > k0:
                total += g[:, 2:] @ steps[k0:k1]
            out[block] = total
        return out

    def clipping(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        w, n = self.width, len(self.counts)
        s0, s1, s2 = self._s0, self._s1, self._s2
        # Whole bins above hi (lower >= hi) and below lo (upper <= lo).
        k = np.searchsorted(self.lower, hi, side="left")
        above = s2[n] - s2[k] - 2 * hi * (s1[n] - s1[k]) + (hi * hi + w * w / 12) * (s0[n] - s0[k])
        j = np.searchsorted(self.upper, lo, side="right")
        below = s2[j] - 2 * lo * s1[j] + (lo * lo + w * w / 12) * s0[j]
        # The bin straddling hi (index k-1) and the one straddling lo (index j).
        kk, jj = np.maximum(k - 1, 0), np.minimum(j, n - 1)
        part_hi = np.where(k > 0, self.counts[kk] * np.maximum(self.upper[kk] - hi, 0) ** 3, 0)
        part_lo = np.where(j < n, self.counts[jj] * np.maximum(lo - self.lower[jj], 0) ** 3, 0)
        # The prefix-sum form can come out a hair below 0 by cancellation.
        return np.maximum(above, 0) + np.maximum(below, 0) + (part_hi + part_lo) / (3 * w)


def _quantizers(qdtype: QuantDtype, symmetric: bool, lo: np.ndarray, hi: np.ndarray):
    """(lo', hi', step) of the quantizer a scheme builds from the range [lo, hi].

    Symmetric: the narrow grid +-(2**(bits-1) - 1) steps of T / (2**(bits-1) - 1) (as
    onnxruntime and TensorRT use for int8). Asymmetric: step (hi - lo) / (qmax - qmin), zero
    point round(qmin - lo / step), so lo' and hi' are the multiples of step nearest lo and hi.
    """
    if symmetric:
        half = (qdtype.levels // 2) - 1
        step = hi / half
        return -hi, hi, step
    span = qdtype.qmax - qdtype.qmin
    step = (hi - lo) / span
    zero_point = np.clip(np.rint(qdtype.qmin - lo / step), qdtype.qmin, qdtype.qmax)
    lo_q = (qdtype.qmin - zero_point) * step
    return lo_q, lo_q + span * step, step


@functools.lru_cache(maxsize=8)
def _geometric_grid(lowest: float, points: int) -> np.ndarray:
    """`np.geomspace(lowest, 1, points)`, computed once (read-only: the same for every search)."""
    grid = np.geomspace(lowest, 1.0, points)
    grid.flags.writeable = False
    return grid


def _search(
    error: Callable[[np.ndarray], np.ndarray],
    coarse: int = 64,
    fine: int = 48,
    lowest: float = 2.0**-12,
) -> float:
    """The fraction f in [lowest, 1] minimising error(f): a geometric grid of `coarse` points
    (7% steps for the defaults: a clipping threshold can sit orders of magnitude below an
    outlier), then `fine` points linearly between the best point's neighbours."""
    grid = _geometric_grid(lowest, coarse)
    err = error(grid)
    k = int(np.argmin(err))
    refine = np.linspace(grid[max(k - 1, 0)], grid[min(k + 1, coarse - 1)], fine)
    err_fine = error(refine)
    j = int(np.argmin(err_fine))
    return float(refine[j]) if err_fine[j] < err[k] else float(grid[k])


MSE_BINS = 1024


def mse_range(stats: RangeStats, qdtype: QuantDtype, symmetric: bool, rounds: int = 2) -> Range:
    """The range whose quantizer (for `qdtype`, `symmetric`) has the least expected squared
    error on the histogram (`QuantizationError`), clipping error included.

    Search: symmetric -> T = f * max|x| over fractions f (`_search`: 64 geometric + 48 linear
    candidates, each evaluated in one vectorized call). Asymmetric one-sided data -> the same
    1-D search on the nonzero end. Asymmetric mixed signs -> first a joint scaling
    f * [min, max], then `rounds` of coordinate descent: the upper end with the lower fixed, then
    the lower with the upper fixed (the error is smooth and nearly separable in the two ends,
    so this converges in a couple of rounds; far cheaper than a fine 2-D grid).
    """
    h = require_data(stats)
    lo_data, hi_data = min(stats.min, 0.0), max(stats.max, 0.0)
    if lo_data == hi_data:  # all zeros
        return 0.0, 0.0
    # The error matrix is candidates x bins: at most MSE_BINS bins (exact pair sums of the
    # grid) keep it 4x cheaper than the observers' 4096, with a bin still under half an int8
    # step of the full range.
    while len(h.counts) > MSE_BINS:
        h = h.coarsen(1)
    expected = QuantizationError(h)

    def error(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        return expected(*_quantizers(qdtype, symmetric, lo, hi))

    if symmetric:
        t_max = abs_max(stats)
        f = _search(lambda f: error(-f * t_max, f * t_max))
        return -f * t_max, f * t_max
    if lo_data == 0.0:
        f = _search(lambda f: error(np.zeros_like(f), f * hi_data))
        return 0.0, f * hi_data
    if hi_data == 0.0:
        f = _search(lambda f: error(f * lo_data, np.zeros_like(f)))
        return f * lo_data, 0.0
    f = _search(lambda f: error(f * lo_data, f * hi_data))
    lo, hi = f * lo_data, f * hi_data

    def upper_end(lo: float, f: np.ndarray) -> np.ndarray:
        return error(np.full_like(f, lo), f * hi_data)

    def lower_end(hi: float, f: np.ndarray) -> np.ndarray:
        return error(f * lo_data, np.full_like(f, hi))

    for _ in range(rounds):
        hi = _search(functools.partial(upper_end, lo)) * hi_data
        lower = _search(functools.partial(lower_end, hi)) * lo_data
        if lower == lo:  # a fixed point: the next round would repeat this one exactly
            break
        lo = lower
    return float(lo), float(hi)
