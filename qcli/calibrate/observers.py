"""Streaming, mergeable statistics of one float tensor: count, min, max, NaN/Inf counts and a
histogram, accumulated batch by batch in memory that does not grow with the number of samples.

Why this histogram
------------------
Every range method (minmax, percentile, kl, mse) is solved afterwards from these statistics,
so the histogram must be built in one pass without knowing the final range, and shards
computed in different processes must merge into exactly what one process would have built.
The usual approaches fail one of these: onnxruntime keeps every activation (memory grows with
the data); a histogram over the first batch's range must be re-binned by interpolation when
the range grows (inexact, and the result depends on batch order); a min/max pre-pass costs a
second inference pass; quantile sketches merge but give no histogram for KL/MSE.

So the bins sit on a fixed grid aligned at 0 with a power-of-two width `w = 2**k`: bin `i` is
`[i*w, (i+1)*w)`. This gives three exact properties:

* Binning is exact in floating point: `x * 2**-k` only changes the exponent, so
  `floor(x * 2**-k)` is the true grid index (no value lands in a neighbour bin by rounding).
* Coarsening is exact: at width `2w`, bin `j` is the union of bins `2j` and `2j+1`, so the
  coarse counts are sums of adjacent pairs (`i >> 1`), never an interpolation.
* The width depends only on the data, not on the order it came in: the histogram always uses
  the smallest `k` at which `[min, max]` spans at most `max_bins` bins (`grid_exponent`).
  Whenever new data does not fit, `k` grows to the smallest exponent that fits everything
  seen so far. Fitting is monotone (more data never fits at a finer width than less data), so
  the final `k` is the smallest one that fits all the data, whatever the batch order or the
  sharding. Hence the final counts equal the histogram of all the data on that grid, and
  `merge` (coarsen both to the common width, add counts) is exact: counts, min, max, and
  element counts are identical to a single-process run.

Resolution: the bins span exactly `[floor(min/w)*w, (floor(max/w)+1)*w)`; if `k` could not
be one smaller, that finer grid needed more than `max_bins` bins, so the data range covers
more than `(max_bins - 1) / 2` bins of width `w`. With the default `max_bins = 4096` that is
at least 2048 bins across `[min, max]` (TensorRT's number for entropy calibration), and at
most 4096. The exceptions are tiny ranges, where `k` is floored so that grid indices stay
exact integers: `w >= 2**-160`, and `w >= max|x| * 2**-52` (finer than float32 can tell
values apart, so such a histogram is exact anyway: e.g. a constant tensor is one bin).

NaN and +-Inf are not binned nor counted in min/max: they are counted apart, so the caller can
refuse the tensor with a clear error (`require_finite`).

Per-sample subsampling (`sample_values`, what calibration uses)
---------------------------------------------------------------
Counting values into bins is the costly step (~3.5 ns a value, numpy's `bincount` alone ~1.8),
while min and max cost ~0.2. With `sample_values = m`, an observer still counts every value
and takes min, max and NaN/Inf counts over every value (exact), but bins only a fixed subset of
each sample: the first samples of the stream whole (`whole_samples`: 32, or fewer for a large
tensor, as many as hold 2**20 values: 4 for 262,144 values a sample, 1 from 2**20), and of every later
sample the flattened values at positions 0, s, 2s, ... where the stride `s` is the largest
prime <= n // m that does not divide the sample's size n (`sample_stride`; every value when
n < 2m). When there is no such prime (n = 9216 = 2**10 * 9 with m = 2048: n // m = 4, and 2
and 3 divide n), the positions walk around the sample: (i * p) % n for i < ceil(n / (n // m)),
p the smallest prime above n // m that does not divide n (`sample_walk`). Such sizes are the
rule in exported models (products of 2, 3 and 5): before the walk, 5 of the PaddleOCR
classifier's tensor shapes (4608-11520 values a sample, 276k of its 2.2M values a sample) were
binned whole, and the walk takes 12-15% off its calibration pass. So:

* every sample contributes at least `m` values (all of them when it holds fewer than 2m), and
  at most about 2m once n >= 2m; the first ones all of theirs, so a short calibration (a few
  samples of a large input) keeps every value, and a tensor's histogram holds at least
  min(all its values, 32 samples' or 2**20 values' worth + m a sample after that). The cap
  in values: binning 32 whole samples of the PaddleOCR recognizer (130 MB of observed values
  a sample) took 4 s of a 32-sample calibration;
* the subset depends only on the sample itself (its values' order and count) and its index in
  the stream (shards are told where they start), never on the batching, the batch order or the sharding: merged shards still equal one pass, byte
  for byte, and the histogram does not change with `--batch-size`;
* a prime stride (or walk step) coprime with n cycles through every position of the inner
  dimensions (a power-of-two stride over a 32x32 feature map would only ever read column 0),
  and the walk's positions are distinct;
* the histogram's grid is still the one [min, max] of all values gives (the extreme bins may
  be empty), and `binned` (stored in the file) is the number of values counted into it.

Why 2048 (`SAMPLE_VALUES`), and why the percentile stays meaningful: the default percentile
99.999 leaves 1e-5 of the binned values in each tail; with 32 whole samples plus 2048 values
a sample after that, the default 256 samples bin at least ~0.5M values of a large tensor
(~5 in the tail; the sample CNN's largest: 1.1M), fewer samples bin everything that matters
most, and a tensor whose samples hold fewer than 4096 values is binned whole. Samples are
taken as exchangeable (as calibration assumes anyway): the first 32 weighing more in the
histogram changes its variance, not what it estimates. Measured on the sample models (256
samples; README, `qcli calibrate`): against binning every value, this moves a percentile, kl
or mse range end by at most 4.4% of the range on the CNN and 6.8% on the transformer (90% of
tensors: <= 2.4%), while calibrating on another 256 samples of the same data moves them by up
to 5.6-7.0%; 1024 values a sample moved some by 7.2% (CNN, mse) and 10.2% (transformer, kl),
so 2048 it is. Re-measured with the walk (same figures on the sample models; on the PaddleOCR
classifier with random inputs, 256 samples: at most 6.1% / 20.5% / 10.7% for percentile / kl /
mse, 90% of tensors <= 4.0%, where another 256 samples move them by up to 14.7% / 121% / 19.2%).
min/max (the `minmax` range, and the cap of every other method) stay exact.

Why numpy and not a compiled loop: counting is a scatter-increment that numpy can only do as
whole-array passes plus `np.bincount` (~3.5-4 ns a value). A numba loop was measured at ~1.6 ns and
without the GIL, but numba costs every calibrating process ~0.35 s to import and ~0.35 s to
load even a cached kernel (+100 MB RSS, +200 MB installed): more than it saves at 512 samples
of the sample models (0.14-0.21 s), so the binning stays in numpy.

A sample's subset is taken along the batch's memory order, which keeps each sample's values
together only when the batch dimension is the first (outermost) one, as in the tensors of the
models exported for batched inference: a batch whose tensor does not have the batch's sample
count as its first dimension is binned whole. (A tensor laid out with the batch inside, e.g.
[sequence, batch, features], whose first dimension happens to equal the sample count would be
subsampled across samples: still deterministic for the same batches, which shards keep.)
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from qcli.errors import CalibrationError, ConfigError

#: Default bin budget: twice TensorRT's 2048, so that at least 2048 bins span [min, max].
DEFAULT_MAX_BINS = 4096

#: Smallest bin-width exponent: bins never get finer than 2**-160 (below float32's subnormals).
MIN_EXPONENT = -160

#: Grid indices stay below 2**INDEX_BITS in magnitude, so they are exact in float64.
INDEX_BITS = 52

#: numpy dtype -> its name (`dtype.name` is a slow property, and `update` needs it per batch).
_DTYPE_NAMES: dict[np.dtype, str] = {}

#: Layouts (dtype, shape) an observer remembers having noted (see `_note_batch_layout`).
_SEEN_LAYOUTS = 1024

#: Values of each sample that calibration bins at least (see the module docstring).
SAMPLE_VALUES = 2048

#: The first samples of the stream are binned whole (see the module docstring): this many, or
#: as many as hold WHOLE_VALUES values when fewer do (`whole_samples`).
WHOLE_SAMPLES = 32
WHOLE_VALUES = 1 << 20


def whole_samples(n: int) -> int:
    """How many of the first samples of `n` values each are binned whole.

    >>> whole_samples(3072), whole_samples(262144), whole_samples(4 << 20)
    (32, 4, 1)
    """
    return max(1, min(WHOLE_SAMPLES, -(-WHOLE_VALUES // max(n, 1))))

#: Elements per chunk in `bin_counts`: keeps the temporaries in cache (measured ~1.5x faster
#: than whole-batch temporaries on a 1M-element batch) and bounds the extra memory.
_CHUNK = 1 << 16


# --------------------------------------------------------------------------- grid arithmetic


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


@functools.lru_cache(maxsize=4096)
def sample_stride(n: int, sample_values: int) -> int:
    """Stride of the values binned from a sample of `n` values: the largest prime `p <= n //
    sample_values` that does not divide `n` (so at least `sample_values` values are binned and
    the positions cycle through every inner dimension); 1 when there is none.

    >>> sample_stride(32768, 1024), sample_stride(3734, 1024), sample_stride(2047, 1024)
    (31, 3, 1)
    """
    p = n // max(sample_values, 1)
    while p >= 2:
        if n % p and _is_prime(p):
            return p
        p -= 1
    return 1


@functools.lru_cache(maxsize=4096)
def sample_walk(n: int, sample_values: int) -> tuple[int, int]:
    """`(step, count)`: a sample of `n` values is binned at positions `(i * step) % n` for
    `i < count`; `(1, n)` (every value) when `n < 2 * sample_values`.

    The step is `sample_stride` when there is such a prime, and then the positions never wrap
    (`count = ceil(n / step)`). Sizes like 9216 = 2**10 * 9 (n // m = 4, and 2 and 3 divide n)
    have none, and activations of exported models are mostly such products of 2, 3 and 5: then
    the step is the smallest prime above n // m that does not divide n and the walk wraps
    around, `count = ceil(n / (n // m)) >= sample_values` values, all distinct (the step is
    coprime with n), cycling through every inner dimension like a stride.

    >>> sample_walk(32768, 1024), sample_walk(9216, 2048), sample_walk(3072, 2048)
    ((31, 1058), (5, 2304), (1, 3072))
    """
    q = n // max(sample_values, 1)
    if q < 2:
        return 1, n
    stride = sample_stride(n, sample_values)
    if stride > 1:
        return stride, -(-n // stride)
    p = q + 1
    while n % p == 0 or not _is_prime(p):
        p += 1
    return p, -(-n // q)


def _is_prime(p: int) -> bool:
    return p >= 2 and all(p % d for d in range(2, math.isqrt(p) + 1))


@functools.lru_cache(maxsize=256)
def _walk_positions(n: int, step: int, count: int) -> np.ndarray:
    """The walk's positions (count <= 1.5 * sample_values + 1: 24 KB at the default), cached for
    the sizes a stream repeats (variable-length data has many: at most 6 MB)."""
    positions = (np.arange(count, dtype=np.int64) * step) % n
    positions.flags.writeable = False
    return positions


def sample_subset(x: np.ndarray, samples: int, sample_values: int | None, first: int = 0) -> np.ndarray | None:
    """The values of batch `x` (holding samples `first .. first+samples-1` of the stream along
    its first dimension) that are binned, flattened: all values of the first `whole_samples`
    samples, each later sample's flattened values at the positions of `sample_walk`. None
    (every value) when `sample_values` is None, or when the first dimension is not the sample
    count."""
    if sample_values is None or samples < 1 or x.ndim == 0 or (samples > 1 and x.shape[0] != samples):
        return None
    n = x.size // samples
    step, count = sample_walk(n, sample_values)
    whole = min(max(whole_samples(n) - first, 0), samples)  # samples binned whole
    if step == 1 or whole == samples:
        return None
    rows = x.reshape(samples, n)
    if (count - 1) * step < n:  # a plain stride
        picked = rows[whole:, ::step].reshape(-1)
    else:
        picked = rows[whole:, _walk_positions(n, step, count)].reshape(-1)
    return np.concatenate([rows[:whole].reshape(-1), picked]) if whole else picked


def bin_counts(x: np.ndarray, exponent: int, first: int, nbins: int) -> np.ndarray:
    """Counts of the finite 1-D array `x` in bins `first .. first+nbins-1` of width 2**exponent.

    Every element must fall in those bins. Equivalent to
    `np.bincount(np.floor(x / 2**exponent).astype(int) - first, minlength=nbins)`, but exact,
    chunked, and in float32 for float16/float32 input when that is exact: the scaled value is
    exact unless it underflows, and subtracting `first` is exact while indices stay below 2**24.
    Underflow only happens with exponent > 0, where a tiny negative value can become -0.0 and
    be floored to bin 0 instead of -1: those are fixed (when there are negative values at all,
    i.e. `first < 0`). float32 work halves the memory traffic of float64 (scale and floor
    measured at 0.5 vs 1.8 ns per value, the -0.0 fix adds 0.4), so wide-range float32
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
    scaled = np.empty(min(_CHUNK, x.size), dtype=work)
    index = np.empty(scaled.size, dtype=np.intp)
    for start in range(0, x.size, _CHUNK):
        chunk = x[start : start + _CHUNK]
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


# ------------------------------------------------------------------------------ histogram


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


def _workable(flat: np.ndarray) -> np.ndarray:
    """`flat` in a dtype min/max and binning handle well."""
    if flat.dtype.itemsize > 8:  # long double: float64 is all quantization can use
        return flat.astype(np.float64)
    if flat.dtype == np.float16:  # numpy's float16 min/max are ~5x slower than a cast
        return flat.astype(np.float32)
    return flat


def _folded_length(first: int, last: int) -> int:
    return max(last, -first - 1) + 1


def _combine(
    a: GridHistogram | None, b: GridHistogram | None, exponent: int, first: int, last: int
) -> np.ndarray:
    """Counts of `a` and `b` added on bins `first..last` of width 2**exponent."""
    counts = np.zeros(last - first + 1, dtype=np.int64)
    for h in (a, b):
        if h is not None:
            h = h.coarsen(exponent - h.exponent)
            counts[h.first - first : h.last - first + 1] += h.counts
    return counts


# ------------------------------------------------------------------------------- observer


class TensorObserver:
    """Accumulates the statistics of one float tensor over a stream of batches.

    >>> obs = TensorObserver(max_bins=16)
    >>> obs.update(np.array([-1.0, 0.0, 0.5, 0.875], dtype=np.float32))
    >>> obs.min, obs.max, obs.count, obs.bin_width
    (-1.0, 0.875, 4, 0.125)
    >>> other = TensorObserver(max_bins=16)
    >>> other.update(np.array([2.5], dtype=np.float32))
    >>> obs.merge(other).max, obs.bin_width  # [-1, 2.5] no longer fits 16 bins of 1/8
    (2.5, 0.25)
    """

    def __init__(self, max_bins: int = DEFAULT_MAX_BINS, name: str | None = None, sample_values: int | None = None):
        if max_bins < 2:
            raise ConfigError(f"histogram needs at least 2 bins, got {max_bins}")
        if sample_values is not None and sample_values < 1:
            raise ConfigError(f"sample_values must be at least 1, got {sample_values}")
        self.name = name
        self.max_bins = int(max_bins)
        # None: every value is binned; else at least this many values of each sample (module doc).
        self.sample_values = sample_values
        self.dtype: str | None = None  # numpy name of the observed dtype, e.g. 'float32'
        self.shape: tuple[int | None, ...] | None = None  # None where batches disagreed
        self.samples = 0
        self.count = 0  # finite elements
        self.binned = 0  # finite elements counted into the histogram (== count without sampling)
        self.nan_count = 0
        self.posinf_count = 0
        self.neginf_count = 0
        self._min = math.inf
        self._max = -math.inf
        self._hist: GridHistogram | None = None
        # `update` adds a batch that falls inside [min, max] into the counts in place; once the
        # histogram has been handed out (`histogram`, `bin_counts`) it is copied first, so a
        # histogram a caller holds never changes under it.
        self._counts_shared = False
        self._seen_layouts: set[tuple[np.dtype, tuple[int, ...]]] = set()

    # ----------------------------------------------------------------- accessors

    @property
    def min(self) -> float:
        """Smallest finite value seen (nan before any)."""
        return self._min if self.count else math.nan

    @property
    def max(self) -> float:
        """Largest finite value seen (nan before any)."""
        return self._max if self.count else math.nan

    @property
    def nonfinite_count(self) -> int:
        return self.nan_count + self.posinf_count + self.neginf_count

    @property
    def histogram(self) -> GridHistogram | None:
        """The histogram of the finite values (None before any)."""
        self._counts_shared = True
        return self._hist

    @property
    def bin_width(self) -> float:
        return self._hist.width if self._hist is not None else math.nan

    @property
    def bin_edges(self) -> np.ndarray:
        return self._hist.edges if self._hist is not None else np.zeros(0)

    @property
    def bin_counts(self) -> np.ndarray:
        self._counts_shared = True
        return self._hist.counts if self._hist is not None else np.zeros(0, dtype=np.int64)

    def __repr__(self) -> str:
        return (
            f"TensorObserver(name={self.name!r}, count={self.count}, min={self.min}, "
            f"max={self.max}, bins={len(self.bin_counts)}, width={self.bin_width})"
        )

    # ---------------------------------------------------------------- accumulate

    def update(self, x: Any, samples: int = 1) -> None:
        """Add a batch (any shape, any float dtype) holding the next `samples` samples."""
        a = x if isinstance(x, np.ndarray) else np.asarray(x)
        first = self.samples
        self.update_layout(a, samples)
        if a.size:
            self.update_batches([(a, samples, first)])

    def update_values(self, x: Any, samples: int = 1, first: int = 0) -> None:
        """Add values without noting a batch (dtype, shape, samples: see `update_layout`);
        `x` holds samples `first .. first+samples-1` of the stream along its first dimension
        (what `sample_subset` bins of them depends on it)."""
        a = x if isinstance(x, np.ndarray) else np.asarray(x)
        if a.dtype.kind != "f":
            raise TypeError(f"observer expects a float tensor, got {a.dtype}")
        if a.size:
            self.update_batches([(a, samples, first)])

    def update_batches(self, parts: list[tuple[np.ndarray, int, int]]) -> None:
        """Add the values of several float batches `(array, samples, first sample)` in one go,
        without noting their layouts.

        The statistics do not depend on how values are grouped into calls, so a caller with
        many small batches can note each batch's layout and pass their values in fewer, larger
        calls (numpy's per-call overhead dominates below ~10**4 elements).
        """
        parts = [part for part in parts if part[0].size]
        if not parts:
            return
        flats = [a.reshape(-1) for a, _, _ in parts]
        values = flats[0] if len(flats) == 1 else np.concatenate(flats)
        binned = values
        if self.sample_values is not None:
            subsets = [sample_subset(a, n, self.sample_values, first) for a, n, first in parts]
            if any(sub is not None for sub in subsets):  # else every value is binned
                subsets = [flat if sub is None else sub for flat, sub in zip(flats, subsets)]
                binned = subsets[0] if len(subsets) == 1 else np.concatenate(subsets)
        self._add(values, binned)

    def _add(self, values: np.ndarray, binned: np.ndarray) -> None:
        """Add 1-D float `values` to count, min, max and NaN/Inf counts, and `binned` (the same
        values, or a subset of them) to the histogram. Large arrays go a chunk at a time: each
        chunk's min/max pass brings it into cache for the binning passes that follow (one read
        from memory instead of three), and the statistics do not depend on the grouping."""
        if binned is not values or values.size <= _CHUNK:
            self._add_chunk(values, binned)
            return
        for start in range(0, values.size, _CHUNK):
            chunk = values[start : start + _CHUNK]
            self._add_chunk(chunk, chunk)

    def _add_chunk(self, flat: np.ndarray, binned: np.ndarray) -> None:
        whole = binned is flat
        flat = _workable(flat)
        binned = flat if whole else _workable(binned)
        lo, hi = float(flat.min()), float(flat.max())
        if not (math.isfinite(lo) and math.isfinite(hi)):  # NaN propagates: one check covers all
            flat = self._count_nonfinite(flat)
            binned = flat if whole else binned[np.isfinite(binned)]
            if flat.size == 0:
                return
            lo, hi = float(flat.min()), float(flat.max())
        self.count += flat.size
        self.binned += binned.size
        self._extend(lo, hi)
        if binned.size == 0:
            return
        h = self._hist
        if self._counts_shared:  # handed out: copy before adding
            h = self._hist = GridHistogram(h.exponent, h.first, h.counts.copy())
            self._counts_shared = False
        # Every value binned: only the batch's own bins [lo, hi]; a subset: the whole grid.
        k = h.exponent
        first, last = (grid_index(lo, k), grid_index(hi, k)) if whole else (h.first, h.last)
        h.counts[first - h.first : last - h.first + 1] += bin_counts(binned, k, first, last - first + 1)

    def _extend(self, lo: float, hi: float) -> None:
        """Make the grid cover [lo, hi] too (coarsening the counts, exactly, if need be)."""
        if self._hist is not None and lo >= self._min and hi <= self._max:
            return
        new_lo, new_hi = min(self._min, lo), max(self._max, hi)
        k = grid_exponent(new_lo, new_hi, self.max_bins)
        first, last = grid_index(new_lo, k), grid_index(new_hi, k)
        self._hist = GridHistogram(k, first, _combine(self._hist, None, k, first, last))
        self._counts_shared = False
        self._min, self._max = new_lo, new_hi

    def _count_nonfinite(self, flat: np.ndarray) -> np.ndarray:
        finite = np.isfinite(flat)
        self.nan_count += int(np.isnan(flat).sum())
        self.posinf_count += int((flat == np.inf).sum())
        self.neginf_count += int((flat == -np.inf).sum())
        return flat[finite]

    def update_layout(self, x: Any, samples: int = 1) -> None:
        """Record a batch's dtype, shape and sample count, but not its values: for a tensor
        whose values are exactly those of another observed tensor (see `adopt_values`)."""
        a = x if isinstance(x, np.ndarray) else np.asarray(x)
        if a.dtype.kind != "f":
            raise TypeError(f"observer expects a float tensor, got {a.dtype}")
        self._note_batch_layout(a.dtype, a.shape)
        self.samples += samples

    def adopt_values(self, other: TensorObserver) -> TensorObserver:
        """Take `other`'s value statistics (counts, min, max, histogram, NaN/Inf counts) as this
        observer's, keeping its own dtype, shape and samples; return it.

        For a tensor that holds exactly `other`'s values, rearranged (the output of Reshape,
        Transpose, Flatten...): every statistic of its values is `other`'s, so observing it
        again would only repeat the work. `other` must have the same `max_bins`.
        """
        if other.max_bins != self.max_bins:
            raise ValueError(f"max_bins differ ({other.max_bins} vs {self.max_bins})")
        self.count, self.binned, self.sample_values = other.count, other.binned, other.sample_values
        self.nan_count, self.posinf_count, self.neginf_count = (
            other.nan_count,
            other.posinf_count,
            other.neginf_count,
        )
        self._min, self._max = other._min, other._max
        h = other._hist
        self._hist = None if h is None else GridHistogram(h.exponent, h.first, h.counts.copy())
        self._counts_shared = False
        return self

    def _note_batch_layout(self, dtype: np.dtype, shape: tuple[int, ...]) -> None:
        # Noting a layout that was noted before changes nothing (the common dtype and the
        # dimension-wise agreement are idempotent, commutative and associative), so recent
        # layouts are remembered: variable-length data repeats a few shapes many times.
        layout = (dtype, shape)
        if layout in self._seen_layouts:
            return
        name = _DTYPE_NAMES.get(dtype)
        if name is None:
            name = _DTYPE_NAMES.setdefault(dtype, dtype.name)
        self._note_layout(name, shape)
        if len(self._seen_layouts) >= _SEEN_LAYOUTS:
            self._seen_layouts.clear()
        self._seen_layouts.add(layout)

    def _note_layout(self, dtype: str, shape: tuple[int | None, ...] | None) -> None:
        if self.dtype is None:
            self.dtype, self.shape = dtype, (tuple(shape) if shape is not None else None)
            return
        # A tensor has one dtype in a model; should batches differ anyway, record the common
        # type (promotion is order-independent, so merged shards still agree).
        if dtype != self.dtype:
            self.dtype = np.result_type(self.dtype, dtype).name
        self.shape = _merge_shape(self.shape, shape)

    def merge(self, other: TensorObserver) -> TensorObserver:
        """Add `other`'s statistics into this observer (in place) and return it.

        Exact: counts, min, max and histogram equal those of one observer that saw both
        streams, in any order (with observers built with different `max_bins`, the smaller
        budget applies).
        """
        if other.sample_values != self.sample_values:
            raise ValueError(f"sample_values differ ({other.sample_values} vs {self.sample_values})")
        if other.dtype is not None:
            self._note_layout(other.dtype, other.shape)
        self.max_bins = min(self.max_bins, other.max_bins)
        self.samples += other.samples
        self.nan_count += other.nan_count
        self.posinf_count += other.posinf_count
        self.neginf_count += other.neginf_count
        if self.count == 0 and other.count == 0:
            return self
        new_lo, new_hi = min(self._min, other._min), max(self._max, other._max)
        k = grid_exponent(new_lo, new_hi, self.max_bins)
        first, last = grid_index(new_lo, k), grid_index(new_hi, k)
        self._hist = GridHistogram(k, first, _combine(self._hist, other._hist, k, first, last))
        self._counts_shared = False
        self._min, self._max = new_lo, new_hi
        self.count += other.count
        self.binned += other.binned
        return self

    def require_finite(self) -> None:
        """Raise CalibrationError naming the tensor if any NaN or Inf was seen."""
        if not self.nonfinite_count:
            return
        counts = ((self.nan_count, "NaN"), (self.posinf_count, "+Inf"), (self.neginf_count, "-Inf"))
        found = " and ".join(f"{n} {what}" for n, what in counts if n)
        raise CalibrationError(
            f"tensor {self.name or '?'!r} has {found} values over {self.samples} samples",
            hint="check the calibration data for NaN/Inf, or exclude the node that makes them",
        )

    # ----------------------------------------------------------------- serialise

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe statistics (plain ints, floats, lists; null when nothing was seen).

        The histogram is stored as its grid: bin `j` is
        `[(first_bin + j) * 2**log2_bin_width, (first_bin + j + 1) * 2**log2_bin_width)`,
        so the edges are exact and need not be listed. `binned` values of the `count` went
        into it: all of them, or at least `sample_values` of each sample (module docstring).
        """
        h = self._hist
        sampling = {} if self.sample_values is None else {"sample_values": self.sample_values, "binned": self.binned}
        return {
            "dtype": self.dtype,
            "shape": list(self.shape) if self.shape is not None else None,
            "samples": self.samples,
            "count": self.count,
            "nan": self.nan_count,
            "posinf": self.posinf_count,
            "neginf": self.neginf_count,
            "min": self._min if self.count else None,
            "max": self._max if self.count else None,
            "max_bins": self.max_bins,
            **sampling,
            "histogram": None
            if h is None
            else {"log2_bin_width": h.exponent, "first_bin": h.first, "counts": h.counts.tolist()},
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], name: str | None = None) -> TensorObserver:
        """Rebuild an observer from `to_dict` output; CalibrationError if it is malformed."""
        where = f"tensor {name!r}" if name else "tensor statistics"
        try:
            max_bins = int(d["max_bins"])
            if max_bins < 2:
                raise ValueError(f"max_bins {max_bins} < 2")
            sample_values = d.get("sample_values")
            obs = cls(max_bins=max_bins, name=name, sample_values=None if sample_values is None else int(sample_values))
            obs.dtype = None if d["dtype"] is None else str(d["dtype"])
            shape = d["shape"]
            if shape is not None:
                obs.shape = tuple(None if s is None else int(s) for s in shape)
            obs.samples, obs.count = int(d["samples"]), int(d["count"])
            obs.binned = int(d.get("binned", obs.count))
            obs.nan_count, obs.posinf_count = int(d["nan"]), int(d["posinf"])
            obs.neginf_count = int(d["neginf"])
            hist = d["histogram"]
            if obs.count:
                obs._min, obs._max = float(d["min"]), float(d["max"])
                counts = np.asarray(hist["counts"], dtype=np.int64)
                exponent, first = int(hist["log2_bin_width"]), int(hist["first_bin"])
                obs._hist = GridHistogram(exponent, first, counts)
            elif hist is not None:
                raise ValueError("histogram present but count is 0")
        except (KeyError, TypeError, ValueError, ConfigError) as e:
            raise CalibrationError(
                f"{where}: malformed calibration statistics ({type(e).__name__}: {e})"
            ) from None
        _check_consistent(obs, where)
        return obs


def _check_consistent(obs: TensorObserver, where: str) -> None:
    """The invariants `update` maintains; a file breaking them was edited or corrupted."""
    h = obs._hist
    if obs.count == 0:
        return
    problem = None
    if h is None or h.counts.ndim != 1 or len(h.counts) == 0:
        problem = "missing histogram"
    elif not (math.isfinite(obs._min) and math.isfinite(obs._max) and obs._min <= obs._max):
        problem = "bad min/max"
    elif h.exponent != grid_exponent(obs._min, obs._max, obs.max_bins):
        # Merging relies on the width being the canonical one for [min, max].
        problem = "bin width is not the one [min, max] and max_bins give"
    elif (grid_index(obs._min, h.exponent), grid_index(obs._max, h.exponent)) != (h.first, h.last):
        problem = "histogram bins do not span [min, max]"
    elif (h.counts < 0).any() or h.total != obs.binned or obs.binned > obs.count:
        problem = "histogram counts do not add up to count"
    elif obs.sample_values is None and obs.binned != obs.count:
        problem = "binned values without sample_values"
    if problem:
        raise CalibrationError(f"{where}: inconsistent calibration statistics: {problem}")


Shape = tuple[int | None, ...]


def _merge_shape(a: Shape | None, b: Shape | None) -> Shape | None:
    """Dimension-wise agreement of two observed shapes; None where they differ (dynamic)."""
    if a is None or b is None or len(a) != len(b):
        return None
    return tuple(x if x == y else None for x, y in zip(a, b))
