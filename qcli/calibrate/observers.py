"""Streaming, mergeable statistics of one float tensor (`TensorObserver`) and their JSON form.

An observer keeps the count, min, max and NaN/Inf counts of every value, and a histogram on the
zero-aligned power-of-two grid of `grid.py` (of every value, or of each sample's subset, see
`sampling.py`), in memory that does not grow with the number of samples. The statistics do not
depend on how the values were batched, ordered or sharded: `merge` gives exactly what one
observer that saw both streams would hold, and `to_dict`/`from_dict` round-trip them exactly.
NaN and +-Inf are counted apart, never binned, so the caller can refuse the tensor
(`require_finite`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from qcli.calibrate.grid import (
    CHUNK,
    DEFAULT_MAX_BINS,
    GridHistogram,
    bin_counts,
    combine,
    grid_exponent,
    grid_index,
)
from qcli.calibrate.sampling import binned_whole, sample_subset
from qcli.errors import CalibrationError, ConfigError

#: numpy dtype -> its name (`dtype.name` is a slow property, and `update` needs it per batch).
_DTYPE_NAMES: dict[np.dtype, str] = {}

#: Layouts (dtype, shape) an observer remembers having noted (see `_note_batch_layout`).
_SEEN_LAYOUTS = 1024


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
        # None: every value is binned; else at least this many values of each sample (sampling.py).
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
        m = self.sample_values
        walked = [m is not None and not binned_whole(a.size, n, m) for a, n, _ in parts]
        if any(walked):
            subsets = [sample_subset(a, n, m, first) if w else None
                       for (a, n, first), w in zip(parts, walked, strict=True)]
            if any(sub is not None for sub in subsets):  # else every value is binned
                picked = [flat if sub is None else sub for flat, sub in zip(flats, subsets, strict=True)]
                binned = picked[0] if len(picked) == 1 else np.concatenate(picked)
        self._add(values, binned)

    def _add(self, values: np.ndarray, binned: np.ndarray) -> None:
        """Add 1-D float `values` to count, min, max and NaN/Inf counts, and `binned` (the same
        values, or a subset of them) to the histogram. Large arrays go a chunk at a time: each
        chunk's min/max pass brings it into cache for the binning passes that follow (one read
        from memory instead of three), and the statistics do not depend on the grouping."""
        if binned is not values or values.size <= CHUNK:
            self._add_chunk(values, binned)
            return
        for start in range(0, values.size, CHUNK):
            chunk = values[start : start + CHUNK]
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
        h = self._extend(lo, hi)
        if binned.size == 0:
            return
        if self._counts_shared:  # handed out: copy before adding
            h = self._hist = GridHistogram(h.exponent, h.first, h.counts.copy())
            self._counts_shared = False
        # Every value binned: only the batch's own bins [lo, hi]; a subset: the whole grid.
        k = h.exponent
        first, last = (grid_index(lo, k), grid_index(hi, k)) if whole else (h.first, h.last)
        h.counts[first - h.first : last - h.first + 1] += bin_counts(binned, k, first, last - first + 1)

    def _extend(self, lo: float, hi: float) -> GridHistogram:
        """Make the grid cover [lo, hi] too (coarsening the counts, exactly, if need be); return
        the histogram."""
        if self._hist is not None and lo >= self._min and hi <= self._max:
            return self._hist
        new_lo, new_hi = min(self._min, lo), max(self._max, hi)
        k = grid_exponent(new_lo, new_hi, self.max_bins)
        first, last = grid_index(new_lo, k), grid_index(new_hi, k)
        self._hist = GridHistogram(k, first, combine(self._hist, None, k, first, last))
        self._counts_shared = False
        self._min, self._max = new_lo, new_hi
        return self._hist

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
        self._hist = GridHistogram(k, first, combine(self._hist, other._hist, k, first, last))
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
        into it: all of them, or at least `sample_values` of each sample (sampling.py).
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
    return tuple(x if x == y else None for x, y in zip(a, b, strict=True))


def _workable(flat: np.ndarray) -> np.ndarray:
    """`flat` in a dtype min/max and binning handle well."""
    if flat.dtype.itemsize > 8:  # long double: float64 is all quantization can use
        return flat.astype(np.float64)
    if flat.dtype == np.float16:  # numpy's float16 min/max are ~5x slower than a cast
        return flat.astype(np.float32)
    return flat
