"""Intervals of figures measured on a sample of n: a share of samples (Wilson's score interval)
and a mean over samples (mean ± z standard errors, from running sums: `Mean`). `z` is the
half-width in standard errors, ~95% two-sided by default (`verify.confidence` sets it:
qcli.analyze.confidence)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

Z95 = 1.959964  # the standard normal's 97.5th percentile: two-sided 95%


def wilson(k: float, n: float, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of the share k/n (`z`: its half-width in standard errors,
    ~95% by default); it stays inside [0, 1] and is not empty at k = n, unlike k/n ± z
    standard errors.

    >>> [round(v, 3) for v in wilson(16, 16)], [round(v, 3) for v in wilson(15, 16)]
    ([0.806, 1.0], [0.717, 0.989])
    """
    if n <= 0:
        return 0.0, 1.0
    p, z2 = k / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def mean_interval(total: float, squares: float, n: int, z: float = Z95) -> tuple[float, float]:
    """The interval of a mean over n samples from their sum and sum of squares (mean ± z
    standard errors, ~95% by default); one sample: the mean alone.

    >>> [round(v, 4) for v in mean_interval(3 * 0.99, 0.98 ** 2 + 0.99 ** 2 + 1.0, 3)]
    [0.9787, 1.0013]
    """
    if n <= 0:
        return 0.0, 1.0
    mean = total / n
    if n == 1:
        return mean, mean
    var = max(squares - n * mean * mean, 0.0) / (n - 1)
    half = z * math.sqrt(var / n)
    return mean - half, mean + half


@dataclass
class Mean:
    """A running mean over samples, with the sum of squares its interval needs.

    >>> m = Mean(); m.add(np.array([1.0, 0.0, 1.0, 1.0])); m.value, [round(v, 3) for v in m.interval()]
    (0.75, [0.26, 1.24])
    """

    n: int = 0
    total: float = 0.0
    squares: float = 0.0

    def add(self, values: np.ndarray) -> None:
        v = np.asarray(values, dtype=np.float64)
        self.n += v.size
        self.total += float(v.sum())
        self.squares += float((v * v).sum())

    @property
    def value(self) -> float | None:
        return self.total / self.n if self.n else None

    def interval(self, z: float = Z95) -> tuple[float, float] | None:
        return mean_interval(self.total, self.squares, self.n, z) if self.n else None

    def share_interval(self, z: float = Z95) -> tuple[float, float] | None:
        """The interval of a mean of shares, kept inside [0, 1]."""
        found = self.interval(z)
        return None if found is None else (max(0.0, found[0]), min(1.0, found[1]))
