"""Which values of each sample a histogram counts: a fixed subset, the sampling walk.

Counting values into bins is the costly part of observing, so with `sample_values = m` a
histogram counts all values of the first `whole_samples(n)` samples of the stream, then, of
every later sample of `n` values, the flattened positions `(i * step) % n` for `i < count`
(`sample_walk`): at least `m` distinct values (every value when `n < 2m`), at a prime step
coprime with `n`, so the positions cycle through every inner dimension. The subset depends
only on the sample itself and its index in the stream, never on the batching, the batch order
or the sharding: merged shards still equal one pass, and `--batch-size` does not change it.
"""

from __future__ import annotations

import functools
import math

import numpy as np

#: Values of each sample that calibration counts into the histogram at least (why 2048:
#: docs/guides/calibration.md, "Which values the histograms count").
SAMPLE_VALUES = 2048

#: The first samples of the stream are counted whole: this many, or as many as hold
#: WHOLE_VALUES values when fewer do (`whole_samples`).
WHOLE_SAMPLES = 32
WHOLE_VALUES = 1 << 20


def whole_samples(n: int) -> int:
    """How many of the first samples of `n` values each are binned whole.

    >>> whole_samples(3072), whole_samples(262144), whole_samples(4 << 20)
    (32, 4, 1)
    """
    return max(1, min(WHOLE_SAMPLES, -(-WHOLE_VALUES // max(n, 1))))


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


def binned_whole(size: int, samples: int, sample_values: int) -> bool:
    """Whether a batch of `size` values holding `samples` samples is binned whole because each
    sample holds fewer than `2 * sample_values` values (`sample_walk`'s `(1, n)`): a caller
    with many small batches asks this before calling `sample_subset`.

    >>> binned_whole(8 * 4095, 8, 2048), binned_whole(8 * 4096, 8, 2048)
    (True, False)
    """
    return size < 2 * sample_values * max(samples, 1)


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
    count.

    Samples are cut along the batch's memory order, as exported models lay out batches (the
    batch dimension first). A tensor laid out with the batch inside (`[sequence, batch, ...]`)
    whose first dimension happens to equal the sample count is cut across samples: still
    deterministic for the same batches, which shards keep.
    """
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
