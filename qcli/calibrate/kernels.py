"""Compiled inner loops of calibration (numba): counting values into a histogram's bins.

Why compiled code here: counting is a scatter-increment (`counts[index(x)] += 1`), which numpy
can only express as several whole-array passes (scale, floor, offset, cast to an index array)
followed by `np.bincount`, which scans the indices once more for their maximum before it counts:
about 4 ns a value on this project's 2-core test machine. The compiled loop computes a block of
indices in one vectorized pass and counts them in a second, in cache: about 1.5 ns a value. It
also reads a sample's strided subset (observers.py) in place instead of copying it out first,
and it runs without the GIL (`nogil`), so the observing thread of a calibration pass works
beside onnxruntime's threads instead of taking turns with the interpreter.

The index of a value is the same formula as the reference `floor(x * 2**-k)` (observers.py),
computed in float64: a float32 or float64 value times a power of two is exact unless it
underflows, and a negative value that underflows to -0.0 goes to bin -1, where floor puts the
value itself. Every index is checked against the counts' bounds before it is counted; a value
outside them (the caller extends the grid over the values first, so there is none) is counted
apart and reported, never written out of bounds.

Kernels are compiled on first use and cached on disk by numba (`cache=True`: next to this file,
or in the user's cache directory when that is not writable), so only the first calibration
after an install pays the compilation (about a second).
"""

from __future__ import annotations

import math

import numba
import numpy as np

#: Indices computed before they are counted: a block that stays in the L2 cache.
_BLOCK = 16384

#: Columns of a segment row (see `bin_segments`).
OFFSET, ROWS, LENGTH, WHOLE, STRIDE = range(5)


@numba.njit(nogil=True, cache=True)
def _count(counts, values, scale, first, fix_zero, block):  # pragma: no cover - compiled
    """Add the 1-D array `values` (any stride) to `counts`, whose bin 0 is grid index `first`;
    return how many values fell outside the counts (not counted)."""
    outside = 0
    size = counts.size
    done = 0
    while done < values.size:
        m = min(block.size, values.size - done)
        src = values[done : done + m]
        if fix_zero:  # a negative value that underflows to -0.0 belongs in bin -1, as floor says
            for j in range(m):
                v = np.float64(src[j])
                y = math.floor(v * scale)
                block[j] = np.int64(y) - first - ((y == 0.0) & (v < 0.0))
        else:
            for j in range(m):
                block[j] = np.int64(math.floor(np.float64(src[j]) * scale)) - first
        lo = hi = np.int64(0)
        for j in range(m):
            lo = min(lo, block[j])
            hi = max(hi, block[j])
        if lo >= 0 and hi < size:
            for j in range(m):
                counts[block[j]] += 1
        else:  # never when the caller extended the grid first; checked anyway
            for j in range(m):
                b = block[j]
                if b >= 0 and b < size:
                    counts[b] += 1
                else:
                    outside += 1
        done += m
    return outside


@numba.njit(nogil=True, cache=True)
def _bin_segments(counts, flat, segments, scale, first, fix_zero):  # pragma: no cover - compiled
    block = np.empty(_BLOCK, np.int64)
    outside = 0
    for s in range(segments.shape[0]):
        offset = segments[s, 0]
        rows = segments[s, 1]
        n = segments[s, 2]
        whole = segments[s, 3]
        stride = segments[s, 4]
        if whole > 0:
            outside += _count(counts, flat[offset : offset + whole * n], scale, first, fix_zero, block)
        for r in range(whole, rows):
            start = offset + r * n
            outside += _count(counts, flat[start : start + n : stride], scale, first, fix_zero, block)
    return outside


def bin_segments(counts: np.ndarray, flat: np.ndarray, segments: np.ndarray, exponent: int, first: int) -> None:
    """Add values of the 1-D float32/float64 array `flat` to `counts` (int64; bin `j` is
    `[(first + j) * 2**exponent, (first + j + 1) * 2**exponent)`).

    Which values: each row of `segments` (int64, columns OFFSET, ROWS, LENGTH, WHOLE, STRIDE)
    describes `ROWS` consecutive samples of `LENGTH` values each, starting at `flat[OFFSET]`:
    the first `WHOLE` samples are counted whole, each later one at positions 0, STRIDE,
    2*STRIDE, ... of its values (observers.py, `sample_subset`). Every counted value must be
    finite and inside the counts' bins: ValueError otherwise (nothing is written outside).
    """
    if counts.dtype != np.int64 or flat.dtype not in (np.float32, np.float64) or flat.ndim != 1:
        raise TypeError(f"bin_segments needs int64 counts and a 1-D float32/float64 array, got {counts.dtype}, {flat.dtype}")
    # float32 values times 2**-exponent never underflow float64; float64 values can, once the
    # exponent is positive.
    fix_zero = flat.dtype == np.float64 and exponent > 0
    outside = _bin_segments(counts, flat, segments, math.ldexp(1.0, -exponent), first, fix_zero)
    if outside:
        raise ValueError(f"{outside} values fell outside the histogram's bins")


def whole(size: int) -> np.ndarray:
    """A segment table that counts all `size` values."""
    return np.array([[0, 1, size, 1, 1]], dtype=np.int64)
