"""Range solvers: from a tensor's calibration statistics (min, max, histogram) to the float
range `(lo, hi)` that its quantization will cover. Always `lo <= 0 <= hi` (zero must be exactly
representable), and `lo == -hi` when `symmetric`.

Every solver is a pure function `(stats, qdtype, symmetric, **params) -> (lo, hi)` reading only
`stats.min`, `stats.max`, `stats.count` and `stats.histogram` (a zero-aligned `GridHistogram`,
see observers.py), so one streaming pass over the data serves every method:

* ``minmax``     the observed range.
* ``percentile`` the p-th percentile of |x| (symmetric) or the (100-p)-th and p-th percentiles.
* ``kl``         TensorRT's entropy calibration: the |x| threshold whose quantized histogram
                 is closest (KL divergence) to the clipped reference histogram.
* ``mse``        the range minimising the expected squared quantize/dequantize error, computed
                 exactly for values spread uniformly within each histogram bin.
"""

from __future__ import annotations

import difflib
import functools
import math
from collections.abc import Callable
from typing import Protocol

import numpy as np

from qcli.calibrate.grid import GridHistogram
from qcli.errors import CalibrationError, ConfigError
from qcli.scheme import QuantDtype

Range = tuple[float, float]


class RangeStats(Protocol):
    """What a solver reads: a TensorObserver fits."""

    name: str | None
    count: int
    min: float
    max: float
    histogram: GridHistogram | None


# ------------------------------------------------------------------------------ helpers


def _require_data(stats: RangeStats) -> GridHistogram:
    if stats.count == 0 or stats.histogram is None:
        raise CalibrationError(
            f"tensor {stats.name or '?'!r} saw no finite values during calibration",
            hint="check that the calibration data reaches this tensor (or exclude its node)",
        )
    return stats.histogram


def _with_zero(lo: float, hi: float) -> Range:
    return float(min(lo, 0.0)), float(max(hi, 0.0))


def _abs_max(stats: RangeStats) -> float:
    return float(max(-stats.min, stats.max, 0.0))


def _quantile(h: GridHistogram, fraction: float) -> float:
    """The value below which `fraction` of the histogram's mass lies, interpolating linearly
    inside the bin (values assumed spread uniformly within a bin).

    >>> h = GridHistogram(exponent=0, first=0, counts=np.array([2, 0, 2]))  # bins [0,1) [1,2) [2,3)
    >>> _quantile(h, 0.25), _quantile(h, 0.5), _quantile(h, 0.75)
    (0.5, 1.0, 2.5)
    """
    cum = np.cumsum(h.counts)
    rank = fraction * float(cum[-1])
    # 0.999 * 1000 is 999.0000000000001: without snapping, the rank would step past a whole
    # value (and across any empty bins, e.g. up to an outlier).
    if abs(rank - round(rank)) <= 1e-9 * max(rank, 1.0):
        rank = float(round(rank))
    j = min(int(np.searchsorted(cum, rank, side="left")), len(cum) - 1)
    below = float(cum[j] - h.counts[j])
    within = (rank - below) / float(h.counts[j]) if h.counts[j] else 1.0
    return (h.first + j + min(max(within, 0.0), 1.0)) * h.width


# ------------------------------------------------------------------------------- minmax


def minmax_range(stats: RangeStats, qdtype: QuantDtype, symmetric: bool) -> Range:
    """The observed range, widened to include 0; symmetric: +-max|x|.

    `qdtype` is unused (the range does not depend on the target type).
    """
    _require_data(stats)
    if symmetric:
        t = _abs_max(stats)
        return -t, t
    return _with_zero(stats.min, stats.max)


# --------------------------------------------------------------------------- percentile


def percentile_range(
    stats: RangeStats, qdtype: QuantDtype, symmetric: bool, percentile: float = 99.999
) -> Range:
    """Clip the tails holding (100 - percentile)% of the values.

    Asymmetric: [q(100-p), q(p)] (each widened to include 0); symmetric: +-q_p(|x|), read from
    the histogram folded at 0. Quantiles interpolate linearly within a bin and never pass the
    observed min/max.

    Example: 1000 values, p = 99.9 -> asymmetric drops the lowest and the highest value;
    symmetric drops the value of largest magnitude.
    """
    if not 50.0 < percentile <= 100.0:
        raise ConfigError(f"percentile must be in (50, 100], got {percentile}")
    h = _require_data(stats)
    p = percentile / 100.0
    if symmetric:
        folded = h.fold(max_bins=max(len(h.counts), 2048))
        t = min(_quantile(folded, p), _abs_max(stats))
        return -t, t
    lo = max(_quantile(h, 1.0 - p), stats.min)
    hi = min(_quantile(h, p), stats.max)
    return _with_zero(lo, hi)


# ----------------------------------------------------------------------------------- kl


def kl_levels(qdtype: QuantDtype, symmetric: bool, lo: float, hi: float) -> int:
    """Quantization levels that the |x| histogram [0, T] is squeezed into by `kl`.

    Symmetric: 2**(bits-1) (one sign's worth: 128 for int8, as in TensorRT). Asymmetric with
    one-signed data: all 2**bits levels cover [0, T] (or [-T, 0]). Asymmetric with both signs:
    2**(bits-1) on |x|, like symmetric; the range is then +-T clipped to [min, max].
    """
    one_sided = lo >= 0.0 or hi <= 0.0
    return qdtype.levels if (one_sided and not symmetric) else qdtype.levels // 2


def kl_divergences(counts: np.ndarray, levels: int, eps: float = 1e-4) -> np.ndarray:
    """KL(P || Q) for every candidate threshold `i` = levels .. len(counts) (in bins).

    For candidate `i` (the algorithm of TensorRT's "8-bit inference" slides, as implemented in
    MXNet/TVM):
      P = counts[:i] with the outliers sum(counts[i:]) added to its last bin;
      Q = counts[:i] merged into `levels` groups of i // levels bins (the last group takes the
          remainder), each group's sum spread evenly over the group's bins where P is nonzero;
      both smoothed: zero bins get eps, nonzero bins give up e = eps * zeros / nonzeros
      (which keeps the sums: |P| = sum(counts), |Q| = sum(counts[:i]));
      KL(P/|P| || Q/|Q|). A candidate whose smoothed P or Q is not positive scores +inf.

    Vectorized over all candidates. With p, q the smoothed values,
    |P| * KL = sum p*log(p) - sum p*log(q) + |P| * log(|Q| / |P|), where
      * bins where P is zero have p = q = eps and add nothing;
      * sum over P's nonzero bins of q's log is per group: q is constant on a group's nonzero
        bins, so it is sum_g log(q_g) * (sum of p over the group), from prefix sums. The first
        levels-1 groups are the same bins for the `levels` candidates that share i // levels;
        with s_g their counts' sum and z_g their nonzero bins, q_g = s_g / z_g - e_q and the
        p-sum is s_g - e_p * z_g, so per such block of candidates the term is one matrix product
        log(q_g - e_q) @ [s_g, z_g] over the groups holding nonzero bins (measured ~10x faster
        than (candidates x levels) arrays of every intermediate; equal to ~1e-11 relative);
      * sum over P's nonzero bins j < i-1 of (h - e) * log(h - e), with counts h >= 1 and
        e <= eps * bins (< 1 for any sensible bin count), is the convergent series
        h*log(h) - e*(log(h) + 1) + sum_{k>=2} e**k / (k*(k-1)*h**(k-1)): each term a prefix
        sum over the bins, summed until the terms fall below float64 resolution.
    P's last bin (counts[i-1] + outliers) is added per candidate.

    Example, counts [5, 3, 2, 1] into 2 levels. i = 4: P = [5, 3, 2, 1], groups [5, 3] and
    [2, 1] give Q = [4, 4, 1.5, 1.5]; no zeros, so no smoothing; KL = (5 ln(5/4) + 3 ln(3/4)
    + 2 ln(2/1.5) + ln(1/1.5)) / 11 = 0.0384. i = 2: P = [5, 3+2+1], Q = [5, 3]; KL = 0.0596.

    >>> kl_divergences(np.array([5, 3, 2, 1]), levels=2).round(4).tolist()  # i = 2, 3, 4
    [0.0596, 0.0041, 0.0384]
    """
    h = np.asarray(counts, dtype=np.float64)
    n = len(h)
    if n < levels or n == 0:
        return np.zeros(0)
    total = h.sum()
    nonzero = h != 0
    cum = np.concatenate([[0.0], np.cumsum(h)])
    cum_nz = np.concatenate([[0], np.cumsum(nonzero)])

    cand = np.arange(levels, n + 1)
    merged = cand // levels
    p_last = total - cum[cand - 1]
    last_nz = p_last != 0
    nnz_p = cum_nz[cand - 1] + last_nz
    e_p = eps * (cand - nnz_p) / nnz_p

    # Q's last group, [(levels-1) * merged, i): per candidate.
    start_l = (levels - 1) * merged
    qsum_l = cum[cand] - cum[start_l]
    norm_l = cum_nz[cand] - cum_nz[start_l] + last_nz - nonzero[cand - 1]
    with np.errstate(divide="ignore", invalid="ignore"):
        q_l = np.where(norm_l > 0, qsum_l / np.where(norm_l > 0, norm_l, 1), 0.0)
        nnz_q = cum_nz[start_l] + (q_l > 0) * norm_l  # the other groups: every nonzero bin below
        e_q = eps * (cand - nnz_q) / nnz_q
        q_s_l = np.where(q_l > 0, q_l - e_q, eps)
    nz_below_l = norm_l - last_nz
    used_l = nz_below_l > 0
    p_mass_l = qsum_l - h[cand - 1] - e_p * nz_below_l
    with np.errstate(divide="ignore", invalid="ignore"):
        cross = np.where(used_l, p_mass_l * np.log(np.where(used_l, q_s_l, 1.0)), 0.0)
    valid = (nnz_q > 0) & ~(used_l & (q_s_l <= 0))

    # The other levels-1 groups: the same bins for all candidates with the same `merged`
    # (levels of them), so per block: log(q_g - e_q) for the groups holding nonzero bins,
    # weighted by the group's sum and its count of nonzero bins (one matrix product).
    group = np.arange(levels - 1)
    for m in range(1, n // levels + 1):
        lo = max(m * levels, levels) - levels
        hi = min(m * levels + levels - 1, n) - levels + 1
        starts = group * m
        nz = cum_nz[starts + m] - cum_nz[starts]
        use = nz > 0
        if not use.any():
            continue
        qs = (cum[starts + m] - cum[starts])[use]
        nz = nz[use].astype(np.float64)
        qv = qs / nz
        eq = e_q[lo:hi]
        with np.errstate(divide="ignore", invalid="ignore"):
            logs = np.log(qv[None, :] - eq[:, None])
        both = logs @ np.stack([qs, nz], axis=1)
        cross[lo:hi] += both[:, 0] - e_p[lo:hi] * both[:, 1]
        valid[lo:hi] &= qv.min() > eq

    hz = np.where(nonzero, h, 1.0)

    def below_last(values):
        return np.concatenate([[0.0], np.cumsum(np.where(nonzero, values, 0.0))])[cand - 1]

    log_h = np.log(hz)
    self_term = below_last(hz * log_h) - e_p * (below_last(log_h) + cum_nz[cand - 1])
    h_min = np.minimum.accumulate(np.where(nonzero, h, np.inf))
    h_min = np.concatenate([[np.inf], h_min])[cand - 1]
    valid &= e_p < h_min
    ratio = float(np.max(np.where(valid, e_p / h_min, 0.0)))
    if ratio > 0:
        terms = min(int(math.ceil(math.log(1e-18) / math.log(ratio))) + 2, 2000)
        inv_h = 1.0 / hz
        power = np.ones(n)
        e_power = e_p.copy()
        for k in range(2, terms + 1):
            power *= inv_h
            e_power *= e_p
            self_term += e_power / (k * (k - 1)) * below_last(power)

    p_s = p_last - e_p
    with np.errstate(divide="ignore", invalid="ignore"):
        last = np.where(last_nz, p_s * np.log(np.where(last_nz, p_s / q_s_l, 1.0)), 0.0)
        valid &= ~(last_nz & ((q_s_l <= 0) | (p_s <= 0)))
        kl = (self_term - cross + last) / total + np.log(cum[cand] / total)
    return np.where(valid, kl, np.inf)


def kl_range(stats: RangeStats, qdtype: QuantDtype, symmetric: bool, bins: int = 2048) -> Range:
    """Entropy (KL) calibration on the histogram of |x|, coarsened to at most `bins` bins.

    The threshold T is the upper edge of the best candidate's last bin (capped at max|x|).
    Symmetric -> (-T, T); asymmetric one-sided data -> [0, T] or [-T, 0] with 2**bits levels;
    asymmetric mixed signs -> (-T, T) clipped to [min, max] (see `kl_levels`). When the levels
    outnumber the bins (16-bit types: 32768 levels; or a near-constant tensor), every candidate
    but the full range is coarser than the histogram itself, so the minmax range is returned.
    """
    h = _require_data(stats)
    levels = kl_levels(qdtype, symmetric, stats.min, stats.max)
    folded = h.fold(max_bins=bins)
    if levels > len(folded.counts):
        return minmax_range(stats, qdtype, symmetric)
    best = levels + int(np.argmin(kl_divergences(folded.counts, levels)))
    t = min(best * folded.width, _abs_max(stats))
    if symmetric:
        return -t, t
    return _with_zero(max(stats.min, -t), min(stats.max, t))


# ---------------------------------------------------------------------------------- mse


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
            l, h, d = lo[block, None], hi[block, None], step[block, None]
            # 3H(x) = n * step**3 / 4 + r**3, n = round(x / step), r = x - n * step.
            # In place, in the same order of operations (the same bits) as the formula.
            x = np.empty((len(block), 2 + max(k1 - k0, 0)))
            x[:, :1], x[:, 1:2] = l, h
            if k1 > k0:
                inner = x[:, 2:]
                np.maximum(edges[k0:k1], l, out=inner)
                np.minimum(inner, h, out=inner)
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
    h = _require_data(stats)
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
        t_max = _abs_max(stats)
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
    for _ in range(rounds):
        hi = _search(lambda f: error(np.full_like(f, lo), f * hi_data)) * hi_data
        lo = _search(lambda f: error(f * lo_data, np.full_like(f, hi))) * lo_data
    return float(lo), float(hi)


# ------------------------------------------------------------------------- registry, util


Solver = Callable[..., Range]

SOLVERS: dict[str, Solver] = {
    "minmax": minmax_range,
    "percentile": percentile_range,
    "kl": kl_range,
    "mse": mse_range,
}


def solve_range(
    method: str, stats: RangeStats, qdtype: QuantDtype, symmetric: bool, **params: float
) -> Range:
    """`SOLVERS[method](stats, qdtype, symmetric, **params)`; ConfigError for an unknown method."""
    try:
        solver = SOLVERS[method]
    except KeyError:
        close = difflib.get_close_matches(str(method), SOLVERS, n=1)
        raise ConfigError(
            f"unknown calibration method {method!r}; expected one of {', '.join(SOLVERS)}",
            hint=f"did you mean {close[0]!r}?" if close else None,
        ) from None
    return solver(stats, qdtype, symmetric, **params)


def clipped_fraction(stats: RangeStats, lo: float, hi: float) -> float:
    """Share of the observed values outside [lo, hi] (0 when the range covers [min, max]);
    values inside a bin are taken as spread uniformly.

    >>> from qcli.calibrate.observers import TensorObserver
    >>> obs = TensorObserver(); obs.update(np.arange(100.0))
    >>> clipped_fraction(obs, 0.0, 99.0), clipped_fraction(obs, 0.0, 89.5)
    (0.0, 0.1)
    """
    h = _require_data(stats)
    below = _mass_below(h, lo) if lo > stats.min else 0.0
    above = h.total - _mass_below(h, hi) if hi < stats.max else 0.0
    return float((below + above) / h.total)


def _mass_below(h: GridHistogram, v: float) -> float:
    """Histogram mass below v, interpolating linearly inside v's bin."""
    pos = v / h.width - h.first  # position in bins from the first edge
    j = int(math.floor(pos))
    if j < 0:
        return 0.0
    if j >= len(h.counts):
        return float(h.total)
    return float(h.counts[:j].sum() + (pos - j) * h.counts[j])
