"""The agreement a model would keep on samples nobody compared, predicted from how far it moved
the float model's decisions (docs/guides/verification.md: a verdict with its uncertainty).

A decision (a sample's class, a sequence's symbol at one position) flips when the quantized
model's change `e` of the float model's margin `m` (its top score minus the runner-up's, in
log space for probabilities) pushes it below 0. Taking the margins and the changes as drawn
independently, the flip rate on unseen samples is the mean over the measured changes of
F(-e), F the CDF of the margins. The empirical F is 0 below the smallest of n margins, yet
unseen samples do have smaller ones, and those are the ones that flip; so F is never taken
below the straight line from 0 to the k-th smallest margin (k = ceil(sqrt(n))), the margins'
mean density near 0. 32 of 32 samples agreeing says little (its interval reaches 0.89); their
margins and changes say how far from flipping they were.

Changes grow with margins, though: in log space a runner-up a million times less likely than
the top moves far more than a close one (PaddleOCR's recognizer: margins' median 10.7, changes
down to -16 where they were large), and pairing those changes with small margins predicted
0.23 of its lines unchanged where 0.99 were. With enough decisions (STRATUM each) they are cut
into up to STRATA strata by margin, and changes are drawn only with margins of their stratum;
the straight line stays in the lowest stratum, where unseen smaller margins would fall.

A quick probe (a few of the compared samples, to screen candidates: qcli.precision) measures
changes on its few samples, but the float model's margins do not depend on the candidate: its
accumulator takes the margins of every compared sample (`pool`), cut into the strata, each
stratum's changes those measured on decisions whose margin falls in it. The screen then judges
as the check on every sample would (PaddleOCR's recognizer weight-only, 8 of 32 held-out lines:
0.32 on their own margins, 0.91 with the 32 lines' margins, 0.90 on all 32).

>>> acc = MarginAccumulator()
>>> acc.update(np.array([[2.0, 0.0], [0.0, 3.0]]), np.array([[1.5, 0.0], [0.0, 3.5]]))
>>> acc.margins.tolist(), acc.changes.tolist(), acc.flip_rate
([2.0, 3.0], [-0.5, 0.5], 0.08333333333333333)
"""

from __future__ import annotations

import math

import numpy as np

STRATA, STRATUM = 32, 256  # strata of margins, and the decisions each needs (module docstring)
TINY = 1e-30  # the probability below which log space stops (float32 softmax underflows to 0)


def flip_rate(margins: np.ndarray, changes: np.ndarray, line: bool = True) -> float:
    """P(m + e < 0) for a margin m and a change e drawn independently from the measured ones
    (module docstring); without `line`, the margins' CDF as measured.

    >>> flip_rate(np.array([1.0, 2.0, 4.0, 8.0]), np.array([0.0, -0.5, 0.1, -1.0]))
    0.09375
    >>> flip_rate(np.array([1.0, 2.0, 4.0, 8.0]), np.array([0.0, -0.5, 0.1, -1.0]), line=False)
    0.0
    """
    n = margins.size
    if n == 0:
        return 0.0
    k = math.ceil(math.sqrt(n))
    ordered = np.sort(margins)
    kth = float(ordered[k - 1])
    drop = np.maximum(-changes, 0.0)
    below = np.searchsorted(ordered, drop, side="left") / n  # margins smaller than the drop
    if not line:
        return float(np.mean(below))
    floor = k / n * np.minimum(drop / kth, 1.0) if kth > 0 else np.where(drop > 0, k / n, 0.0)
    return float(np.mean(np.maximum(below, floor)))


def probabilities(x: np.ndarray) -> bool:
    """Rows of non-negative scores summing to 1: a softmax's probabilities."""
    return bool(x.size) and float(x.min()) >= 0 and bool(np.allclose(x.sum(axis=1), 1.0, atol=1e-3))


def _others_max(x: np.ndarray, top: np.ndarray) -> np.ndarray:
    """Each row's largest score outside column `top`."""
    rows = np.arange(x.shape[0])
    masked = x.copy()
    masked[rows, top] = -np.inf
    return masked.max(axis=1)


class MarginAccumulator:
    """Per decision (each row of scores over the last axis), the float margin and the quantized
    model's change of it, over all batches; whether the scores are probabilities is decided
    on the first batch. Keeps two float32 per decision (a sample, or a sequence's position): 8
    MB for a million decisions, 25,000 lines of a 40-position recognizer)."""

    def __init__(self, pool: MarginPool | None = None) -> None:
        self.log: bool | None = None
        self._margins: list[np.ndarray] = []
        self._changes: list[np.ndarray] = []
        self.pool = pool  # the float margins of more samples than these (module docstring)

    def update(self, reference: np.ndarray, value: np.ndarray, classes: int | None = None) -> None:
        """One batch: the scores over the last axis, or (`classes`) flattened arrays whose rows
        are runs of `classes` scores (the float64 rows the caller made already)."""
        x = np.asarray(reference, dtype=np.float64)
        y = np.asarray(value, dtype=np.float64)
        c = classes if classes is not None else (x.shape[-1] if x.ndim else 0)
        if c < 2:
            return
        x, y = x.reshape(-1, c), y.reshape(-1, c)
        if self.log is None:
            self.log = probabilities(x)
        if self.log:
            x, y = np.log(np.maximum(x, TINY)), np.log(np.maximum(y, TINY))
        keep = np.isfinite(x).all(axis=1) & np.isfinite(y).all(axis=1)
        x, y = x[keep], y[keep]
        top = x.argmax(axis=1)
        rows = np.arange(x.shape[0])
        margin = x[rows, top] - _others_max(x, top)
        self.add(margin, y[rows, top] - _others_max(y, top) - margin)

    def add(self, margins: np.ndarray, changes: np.ndarray) -> None:
        """Decisions whose float margins and changes were measured elsewhere (a CTC path's:
        qcli.analyze.sequences); the ones without finite figures are left out."""
        keep = np.isfinite(margins) & np.isfinite(changes)
        self._margins.append(margins[keep].astype(np.float32))
        self._changes.append(changes[keep].astype(np.float32))

    @property
    def margins(self) -> np.ndarray:
        return np.concatenate(self._margins).astype(np.float64) if self._margins else np.zeros(0)

    @property
    def changes(self) -> np.ndarray:
        return np.concatenate(self._changes).astype(np.float64) if self._changes else np.zeros(0)

    @property
    def decisions(self) -> int:
        return sum(m.size for m in self._margins)

    @property
    def flip_rate(self) -> float | None:
        """`flip_rate` within each stratum of margins (module docstring), weighted by size."""
        if not self._margins:
            return None
        margins, changes = self.margins, self.changes
        if self._pooled and margins.size:
            assert self.pool is not None  # _pooled
            return self.pool.flip_rate(margins, changes)
        order = np.argsort(margins, kind="stable")
        strata = np.array_split(order, max(1, min(STRATA, margins.size // STRATUM)))
        return float(sum(part.size * flip_rate(margins[part], changes[part], line=k == 0)
                         for k, part in enumerate(strata)) / max(margins.size, 1))

    def predicted(self, samples: int) -> float | None:
        """The share of unseen samples whose every decision stays: (1 - flip rate) ** (decisions
        per sample; the pool's, when there is one)."""
        rate = self.flip_rate
        if rate is None or samples <= 0:
            return None
        if self._pooled:
            assert self.pool is not None  # _pooled
            return (1.0 - rate) ** (self.pool.margins.size / self.pool.samples)
        return (1.0 - rate) ** (self.decisions / samples)

    @property
    def _pooled(self) -> bool:
        """Whether the flip rate comes from the pool's margins (module docstring)."""
        return self.pool is not None and self.pool.margins.size > 0 and self.decisions > 0


class MarginPool:
    """The float model's margins of the decisions of `samples` samples (module docstring)."""

    def __init__(self, margins: np.ndarray, samples: int) -> None:
        self.margins = np.sort(margins[np.isfinite(margins)].astype(np.float64))
        self.samples = samples

    def flip_rate(self, margins: np.ndarray, changes: np.ndarray) -> float:
        """The flip rate of decisions with these margins from the pool's strata: each stratum's
        margins, and the changes measured on decisions whose margin falls in it (in none: the
        nearest stratum's that has some).

        >>> pool = MarginPool(np.array([1.0, 2.0, 4.0, 8.0]), 4)
        >>> pool.flip_rate(np.array([2.0]), np.array([-0.5]))  # as `flip_rate` on the pool
        0.125
        """
        m = self.margins
        strata = np.array_split(np.arange(m.size), max(1, min(STRATA, m.size // STRATUM)))
        which = np.searchsorted([m[part[0]] for part in strata[1:]], margins, side="right")
        measured = np.unique(which)
        total = 0.0
        for k, part in enumerate(strata):
            nearest = measured[np.argmin(np.abs(measured - k))]
            total += part.size * flip_rate(m[part], changes[which == nearest], line=k == 0)
        return total / m.size
