"""The zero-aligned power-of-two grid that every histogram of qcli sits on, and its counting.

Bin `i` of the grid of width `w = 2**k` is `[i*w, (i+1)*w)`. Binning is exact in floating point
(`x * 2**-k` only changes the exponent), and coarsening is exact (bin `j` at width `2w` is the
union of bins `2j` and `2j+1`). A histogram always uses the smallest `k` at which its `[min, max]`
spans at most `max_bins` bins (`grid_exponent`), and that `k` is monotone in the range: so the
width depends only on the data, never on the order or the grouping it came in, and histograms of
different streams merge exactly (coarsen both to the common width, add the counts). At that
width more than `(max_bins - 1) / 2` bins span `[min, max]`, except for tiny ranges, where the
width is floored so that grid indices stay exact (`MIN_EXPONENT`, `INDEX_BITS`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from qcli.errors import ConfigError

#: Default bin budget: twice TensorRT's 2048, so that at least 2048 bins span [min, max].
DEFAULT_MAX_BINS = 4096

#: Smallest bin-width exponent: bins never get finer than 2**-160 (below float32's subnormals).
MIN_EXPONENT = -160

#: Grid indices stay below 2**INDEX_BITS in magnitude, so they are exact in float64.
INDEX_BITS = 52

#: Elements per chunk in `bin_counts` (and in the observer's passes): keeps the temporaries in
#: cache and bounds the extra memory.
CHUNK = 1 << 16


def grid_index(value: float, exponent: int) -> int:
    """Index of the bin holding `value` on the grid of width `2**exponent`: floor(value / w).

    Exact for any finite float: `ldexp` only changes the exponent.

    >>> grid_index(0.3, -2), grid_index(-0.3, -2), grid_index(0.0, 5)
    (1, -2, 0)
    """
    index = math.floor(math.ldexp(value, -exponent))
    if index == 0 and value < 0:  # a tiny negative value underflowed to -0.0
        return -1
    return index


def grid_exponent(lo: float, hi: float, max_bins: int) -> int:
    """Smallest exponent `k` at which `[lo, hi]` spans at most `max_bins` bins of width 2**k
    (and at least MIN_EXPONENT, and coarse enough that indices of `lo`/`hi` stay exact).

    The result is monotone in the data: widening `[lo, hi]` never lowers it. That is what
    makes the final histogram independent of batch order and sharding.

    >>> grid_exponent(-1.0, 0.9, 16)  # 16 bins of 1/8 span [-1, 1)
    -3
    >>> grid_exponent(-1.0, 1.0, 16)  # 1.0 starts a 17th bin: width 1/4
    -2
    """
    if max_bins < 2:
        raise ConfigError(f"histogram needs at least 2 bins, got {max_bins}")
    magnitude = max(-lo, hi, 0.0)
    floor_k = MIN_EXPONENT
    if magnitude > 0:
        floor_k = max(floor_k, math.frexp(magnitude)[1] - INDEX_BITS)

    def fits(k: int) -> bool:
        return grid_index(hi, k) - grid_index(lo, k) + 1 <= max_bins

    k = floor_k
    if hi > lo:  # start near the answer; the loops below make it exact
        spread = math.frexp(hi / 2 - lo / 2)[1] + 1  # hi - lo < 2**spread, without overflow
        k = max(floor_k, spread - max_bins.bit_length() + 1)
    while not fits(k):
        k += 1
    while k > floor_k and fits(k - 1):
        k -= 1
    return k


def bin_counts(x: np.ndarray, exponent: int, first: int, nbins: int) -> np.ndarray:
    """Counts of the finite 1-D array `x` in bins `first .. first+nbins-1` of width 2**exponent.

    Every element must fall in those bins. Equivalent to
    `np.bincount(np.floor(x / 2**exponent).astype(int) - first, minlength=nbins)`, but exact,
    chunked, and in float32 for float16/float32 input when that is exact: the scaled value is
    exact unless it underflows, and subtracting `first` is exact while indices stay below 2**24.
    Underflow only happens with exponent > 0, where a tiny negative value can become -0.0 and
    be floored to bin 0 instead of -1: those are fixed (when there are negative values at all,
    i.e. `first < 0`). float32 work halves the memory traffic of float64, so wide-range float32
    tensors use it too.
    """
    small = x.dtype in (np.float16, np.float32)
    fits32 = max(abs(first), abs(first + nbins)) < (1 << 24) and -127 <= exponent <= 126
    work = np.dtype(np.float32) if small and fits32 else np.dtype(np.float64)
    # float16 values scaled by 2**-exponent never reach float32's underflow; float32 and
    # float64 values can (in float32 or float64 work) once the exponent is positive.
    fix_negative_zero = exponent > 0 and first < 0 and x.dtype.itemsize >= 4
    scale = work.type(math.ldexp(1.0, -exponent))

    counts = None
    scaled = np.empty(min(CHUNK, x.size), dtype=work)
    index = np.empty(scaled.size, dtype=np.intp)
    for start in range(0, x.size, CHUNK):
        chunk = x[start : start + CHUNK]
        y, i = scaled[: chunk.size], index[: chunk.size]
        np.multiply(chunk, scale, out=y, dtype=work)
        np.floor(y, out=y)
        if fix_negative_zero:
            y[(y == 0) & (chunk < 0)] = -1
        y -= first
        np.copyto(i, y, casting="unsafe")
        if counts is None:
            counts = np.bincount(i, minlength=nbins).astype(np.int64, copy=False)
        else:
            counts += np.bincount(i, minlength=nbins)
    return counts if counts is not None else np.zeros(nbins, dtype=np.int64)


@dataclass(frozen=True)
class GridHistogram:
    """Counts on the zero-aligned grid of width `2**exponent`: `counts[j]` counts values in
    `[(first + j) * w, (first + j + 1) * w)`.

    >>> h = GridHistogram(exponent=-1, first=-2, counts=np.array([1, 0, 3, 2]))
    >>> h.edges.tolist()
    [-1.0, -0.5, 0.0, 0.5, 1.0]
    >>> h.coarsen(1).counts.tolist(), h.coarsen(1).edges.tolist()
    ([1, 5], [-1.0, 0.0, 1.0])
    """

    exponent: int
    first: int
    counts: np.ndarray

    @property
    def width(self) -> float:
        return math.ldexp(1.0, self.exponent)

    @property
    def last(self) -> int:
        """Grid index of the last bin."""
        return self.first + len(self.counts) - 1

    @property
    def edges(self) -> np.ndarray:
        """The len(counts) + 1 bin edges (float64, exact)."""
        return np.ldexp(np.arange(self.first, self.last + 2, dtype=np.float64), self.exponent)

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    def coarsen(self, steps: int) -> GridHistogram:
        """The same data at width `2**(exponent + steps)`: adjacent bins summed, exactly."""
        if steps == 0:
            return self
        steps = min(steps, 63)  # indices are < 2**53: more shifting changes nothing
        grid = (self.first + np.arange(len(self.counts), dtype=np.int64)) >> steps
        starts = np.flatnonzero(np.diff(grid, prepend=grid[0] - 1))
        counts = np.add.reduceat(self.counts, starts)
        return GridHistogram(self.exponent + steps, self.first >> steps, counts)

    def fold(self, max_bins: int | None = None) -> GridHistogram:
        """Histogram of |x| on the same grid, bin `m` covering `[m*w, (m+1)*w)`.

        Grid alignment makes this exact up to a boundary convention: a negative bin
        `[i*w, (i+1)*w)` maps onto |x| bin `-i-1` as `(m*w, (m+1)*w]`, so only values exactly on
        a grid edge can sit one bin lower than a true |x| histogram would put them. Data far
        from 0 gives a long folded histogram (it starts at 0); with `max_bins` it is coarsened
        (exactly: folding and coarsening commute on this grid) until it has at most that many.

        >>> GridHistogram(-1, -2, np.array([1, 0, 3, 2])).fold().counts.tolist()
        [3, 3]
        """
        steps = 0
        if max_bins is not None:
            while _folded_length(self.first >> steps, self.last >> steps) > max_bins:
                steps += 1
        h = self.coarsen(steps)
        folded = np.zeros(_folded_length(h.first, h.last), dtype=np.int64)
        positive = h.counts[max(0, -h.first) :]
        folded[max(h.first, 0) : max(h.first, 0) + len(positive)] += positive
        negative = h.counts[: max(0, min(-h.first, len(h.counts)))]  # grid indices first..-1
        if len(negative):
            # grid index i < 0 -> |x| index -i-1: first -> -first-1 down to -1 -> 0.
            folded[-h.first - len(negative) : -h.first] += negative[::-1]
        return GridHistogram(h.exponent, 0, folded)


def _folded_length(first: int, last: int) -> int:
    return max(last, -first - 1) + 1


def combine(
    a: GridHistogram | None, b: GridHistogram | None, exponent: int, first: int, last: int
) -> np.ndarray:
    """Counts of `a` and `b` added on bins `first..last` of width 2**exponent."""
    counts = np.zeros(last - first + 1, dtype=np.int64)
    for h in (a, b):
        if h is not None:
            h = h.coarsen(exponent - h.exponent)
            counts[h.first - first : h.last - first + 1] += h.counts
    return counts
