"""Entropy (KL) calibration, as TensorRT's: the |x| threshold whose quantized histogram is
closest (KL divergence) to the histogram clipped at that threshold.

`kl_divergences` scores every candidate threshold of a histogram at once (TensorRT's "8-bit
inference" algorithm, as MXNet and TVM implement it), vectorized over the candidates with prefix
sums; `kl_range` picks the best one on the histogram of |x|.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from qcli.calibrate.ranges import Range, RangeStats, abs_max, minmax_range, require_data, with_zero
from qcli.scheme import QuantDtype


def kl_levels(qdtype: QuantDtype, symmetric: bool, lo: float, hi: float) -> int:
    """Quantization levels that the |x| histogram [0, T] is squeezed into by `kl`.

    Symmetric: 2**(bits-1) (one sign's worth: 128 for int8, as in TensorRT). Asymmetric with
    one-signed data: all 2**bits levels cover [0, T] (or [-T, 0]). Asymmetric with both signs:
    2**(bits-1) on |x|, like symmetric; the range is then +-T clipped to [min, max].
    """
    one_sided = lo >= 0.0 or hi <= 0.0
    return qdtype.levels if (one_sided and not symmetric) else qdtype.levels // 2


def kl_range(stats: RangeStats, qdtype: QuantDtype, symmetric: bool, bins: int = 2048) -> Range:
    """Entropy (KL) calibration on the histogram of |x|, coarsened to at most `bins` bins.

    The threshold T is the upper edge of the best candidate's last bin (capped at max|x|).
    Symmetric -> (-T, T); asymmetric one-sided data -> [0, T] or [-T, 0] with 2**bits levels;
    asymmetric mixed signs -> (-T, T) clipped to [min, max] (see `kl_levels`). When the levels
    outnumber the bins (16-bit types: 32768 levels; or a near-constant tensor), every candidate
    but the full range is coarser than the histogram itself, so the minmax range is returned.
    """
    h = require_data(stats)
    levels = kl_levels(qdtype, symmetric, stats.min, stats.max)
    folded = h.fold(max_bins=bins)
    if levels > len(folded.counts):
        return minmax_range(stats, qdtype, symmetric)
    best = levels + int(np.argmin(kl_divergences(folded.counts, levels)))
    t = min(best * folded.width, abs_max(stats))
    if symmetric:
        return -t, t
    return with_zero(max(stats.min, -t), min(stats.max, t))


def kl_divergences(counts: np.ndarray, levels: int, eps: float = 1e-4) -> np.ndarray:
    """KL(P || Q) for every candidate threshold `i` = levels .. len(counts) (in bins).

    For candidate `i`:
      P = counts[:i] with the outliers sum(counts[i:]) added to its last bin;
      Q = counts[:i] merged into `levels` groups of i // levels bins (the last group takes the
          remainder), each group's sum spread evenly over the group's bins where P is nonzero;
      both smoothed: zero bins get eps, nonzero bins give up e = eps * zeros / nonzeros
      (which keeps the sums: |P| = sum(counts), |Q| = sum(counts[:i]));
      KL(P/|P| || Q/|Q|). A candidate whose smoothed P or Q is not positive scores +inf.

    With p, q the smoothed values, |P| * KL = sum p*log(p) - sum p*log(q) + |P| * log(|Q| / |P|),
    where bins with P zero have p = q = eps and add nothing. The steps: Q's last group and its
    smoothing (`_last_group`), the cross term sum p*log(q) per group of Q (`_cross_term`), the
    self term sum p*log(p) over P's bins (`_p_log_p`), then P's last bin (counts[i-1] plus the
    outliers) per candidate.

    Example, counts [5, 3, 2, 1] into 2 levels. i = 4: P = [5, 3, 2, 1], groups [5, 3] and
    [2, 1] give Q = [4, 4, 1.5, 1.5]; no zeros, so no smoothing; KL = (5 ln(5/4) + 3 ln(3/4)
    + 2 ln(2/1.5) + ln(1/1.5)) / 11 = 0.0384. i = 2: P = [5, 3+2+1], Q = [5, 3]; KL = 0.0596.

    >>> kl_divergences(np.array([5, 3, 2, 1]), levels=2).round(4).tolist()  # i = 2, 3, 4
    [0.0596, 0.0041, 0.0384]
    """
    h = np.asarray(counts, dtype=np.float64)
    if len(h) < levels or len(h) == 0:
        return np.zeros(0)
    c = _Candidates.of(h, levels, eps)
    last = _last_group(c)
    cross, valid = _cross_term(c, last)
    self_term, valid = _p_log_p(c, valid)

    p_s = c.p_last - c.e_p
    q_s_l, last_nz = last.q_smoothed, c.last_nz
    with np.errstate(divide="ignore", invalid="ignore"):
        p_last_term = np.where(last_nz, p_s * np.log(np.where(last_nz, p_s / q_s_l, 1.0)), 0.0)
        valid &= ~(last_nz & ((q_s_l <= 0) | (p_s <= 0)))
        kl = (self_term - cross + p_last_term) / c.total + np.log(c.cum[c.cand] / c.total)
    return np.where(valid, kl, np.inf)


@dataclass(frozen=True)
class _Candidates:
    """What the steps of `kl_divergences` share: the counts `h` (float64), their prefix sums, the
    candidate thresholds and P's smoothing for each."""

    h: np.ndarray
    levels: int
    eps: float
    total: float
    nonzero: np.ndarray  # h != 0
    cum: np.ndarray  # cum[j]: sum of h[:j]
    cum_nz: np.ndarray  # cum_nz[j]: nonzero bins among h[:j]
    cand: np.ndarray  # the thresholds levels .. len(h), in bins
    p_last: np.ndarray  # P's last bin: h[i-1] plus the outliers
    last_nz: np.ndarray  # p_last != 0
    e_p: np.ndarray  # what each nonzero bin of P gives up to smooth its zero bins

    @classmethod
    def of(cls, h: np.ndarray, levels: int, eps: float) -> _Candidates:
        total = h.sum()
        nonzero = h != 0
        cum = np.concatenate([[0.0], np.cumsum(h)])
        cum_nz = np.concatenate([[0], np.cumsum(nonzero)])
        cand = np.arange(levels, len(h) + 1)
        p_last = total - cum[cand - 1]
        last_nz = p_last != 0
        nnz_p = cum_nz[cand - 1] + last_nz
        e_p = eps * (cand - nnz_p) / nnz_p
        return cls(h, levels, eps, total, nonzero, cum, cum_nz, cand, p_last, last_nz, e_p)

    def below_last(self, values: np.ndarray) -> np.ndarray:
        """Per candidate i: the sum of `values` over the nonzero bins j < i-1."""
        return np.concatenate([[0.0], np.cumsum(np.where(self.nonzero, values, 0.0))])[self.cand - 1]


@dataclass(frozen=True)
class _LastGroup:
    """Q's last group, `[(levels-1) * (i // levels), i)`, per candidate i."""

    e_q: np.ndarray  # what each nonzero bin of Q gives up to smooth its zero bins
    q_smoothed: np.ndarray  # the group's smoothed q (eps where it holds no nonzero bin of P)
    cross: np.ndarray  # its part of sum p*log(q), P's last bin left out
    valid: np.ndarray  # False where a smoothed q is not positive


def _last_group(c: _Candidates) -> _LastGroup:
    """Q's last group per candidate; it also settles Q's smoothing (`e_q`): Q's other groups
    hold every nonzero bin below it."""
    h, cum, cum_nz, cand, last_nz = c.h, c.cum, c.cum_nz, c.cand, c.last_nz
    start_l = (c.levels - 1) * (cand // c.levels)
    qsum_l = cum[cand] - cum[start_l]
    norm_l = cum_nz[cand] - cum_nz[start_l] + last_nz - c.nonzero[cand - 1]
    with np.errstate(divide="ignore", invalid="ignore"):
        q_l = np.where(norm_l > 0, qsum_l / np.where(norm_l > 0, norm_l, 1), 0.0)
        nnz_q = cum_nz[start_l] + (q_l > 0) * norm_l  # the other groups: every nonzero bin below
        e_q = c.eps * (cand - nnz_q) / nnz_q
        q_s_l = np.where(q_l > 0, q_l - e_q, c.eps)
    nz_below_l = norm_l - last_nz
    used_l = nz_below_l > 0
    p_mass_l = qsum_l - h[cand - 1] - c.e_p * nz_below_l
    with np.errstate(divide="ignore", invalid="ignore"):
        cross = np.where(used_l, p_mass_l * np.log(np.where(used_l, q_s_l, 1.0)), 0.0)
    valid = (nnz_q > 0) & ~(used_l & (q_s_l <= 0))
    return _LastGroup(e_q, q_s_l, cross, valid)


def _cross_term(c: _Candidates, last: _LastGroup) -> tuple[np.ndarray, np.ndarray]:
    """The cross term sum p*log(q) of all of Q's groups, and which candidates stay valid.

    Q is constant on a group's nonzero bins, so its part is log(q_g) * (the group's p-sum). The
    first levels-1 groups are the same bins for the `levels` candidates that share
    m = i // levels: with s_g a group's counts and z_g its nonzero bins, q_g = s_g / z_g - e_q and
    the p-sum is s_g - e_p * z_g, so each such block of candidates is one matrix product
    log(q_g - e_q) @ [s_g, z_g] over the groups holding nonzero bins.
    """
    cum, cum_nz, levels, n = c.cum, c.cum_nz, c.levels, len(c.h)
    cross, valid = last.cross.copy(), last.valid.copy()
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
        eq = last.e_q[lo:hi]
        # One product per block rather than (candidates x levels) arrays of every intermediate:
        # about ten times faster, and equal to ~1e-11 relative.
        with np.errstate(divide="ignore", invalid="ignore"):
            logs = np.log(qv[None, :] - eq[:, None])
        both = logs @ np.stack([qs, nz], axis=1)
        cross[lo:hi] += both[:, 0] - c.e_p[lo:hi] * both[:, 1]
        valid[lo:hi] &= qv.min() > eq
    return cross, valid


def _p_log_p(c: _Candidates, valid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The self term sum p*log(p) over P's nonzero bins j < i-1, and which candidates stay valid.

    With counts h >= 1 and e = e_p <= eps * bins (< 1 for any sensible bin count),
    (h - e) * log(h - e) is the convergent series
    h*log(h) - e*(log(h) + 1) + sum_{k>=2} e**k / (k*(k-1)*h**(k-1)): each term a prefix sum over
    the bins, summed until the terms fall below float64 resolution.
    """
    h, nonzero, e_p, n = c.h, c.nonzero, c.e_p, len(c.h)
    hz = np.where(nonzero, h, 1.0)
    log_h = np.log(hz)
    self_term = c.below_last(hz * log_h) - e_p * (c.below_last(log_h) + c.cum_nz[c.cand - 1])
    h_min = np.minimum.accumulate(np.where(nonzero, h, np.inf))
    h_min = np.concatenate([[np.inf], h_min])[c.cand - 1]
    valid = valid & (e_p < h_min)
    ratio = float(np.max(np.where(valid, e_p / h_min, 0.0)))
    if ratio > 0:
        terms = min(int(math.ceil(math.log(1e-18) / math.log(ratio))) + 2, 2000)
        inv_h = 1.0 / hz
        power = np.ones(n)
        e_power = e_p.copy()
        for k in range(2, terms + 1):
            power *= inv_h
            e_power *= e_p
            self_term += e_power / (k * (k - 1)) * c.below_last(power)
    return self_term, valid
