"""What a verdict on n samples can show, in plain words (`verify.confidence`: how sure a pass
must be).

An agreement measured on n samples, k of them changed, says little about rates below ~1/n: a
1% change rate leaves all of 32 samples unchanged 72 times in 100. So each agreement check
states, at the configured confidence c:
- the change rate the samples rule out: the one-sided Clopper-Pearson upper bound, the largest
  rate p with P(at most k changes in n | p) >= 1 - c (k = 0: 1 - (1 - c)^(1/n));
- how often a change rate at the floor (1 - floor) goes unseen: floor^n;
- the samples without a change that show the floor: the least n with floor^n <= 1 - c, which
  `--eval-data DIR` supplies.
The verdict's intervals are taken at the same confidence (`z_of`): an interval's lower end is
the one-sided bound at c, so c = 0.975 gives the ~95% two-sided interval qcli used before the
key existed, which stays the default.

>>> round(upper_rate(0, 32, 0.975), 4), round(unseen(0.01, 32), 2), samples_needed(0.99, 0.975)
(0.1089, 0.72, 368)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from statistics import NormalDist

DEFAULT = 0.975


def z_of(confidence: float) -> float:
    """The standard normal quantile at `confidence`: an interval's half-width in standard errors.

    >>> round(z_of(0.975), 4), round(z_of(0.9), 4)
    (1.96, 1.2816)
    """
    return NormalDist().inv_cdf(confidence)


def unseen(rate: float, n: int) -> float:
    """The probability that n samples show no change at a change rate `rate`."""
    return (1.0 - rate) ** n


def _at_most(k: int, n: int, p: float) -> float:
    """P(at most k changes in n samples | change rate p)."""
    if p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 1.0 if k >= n else 0.0
    logs = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * math.log(p)
            + (n - i) * math.log1p(-p) for i in range(k + 1)]
    top = max(logs)
    return min(1.0, math.exp(top) * sum(math.exp(v - top) for v in logs))


def upper_rate(changed: int, n: int, confidence: float) -> float:
    """The change rate that `changed` of n samples rule out at `confidence` (module docstring)."""
    if n <= 0 or changed >= n:
        return 1.0
    if changed == 0:
        return 1.0 - (1.0 - confidence) ** (1.0 / n)
    low, high = changed / n, 1.0
    for _ in range(60):  # bisection: P(at most k | p) falls as p rises
        mid = (low + high) / 2
        low, high = (mid, high) if _at_most(changed, n, mid) > 1.0 - confidence else (low, mid)
    return high


def samples_needed(floor: float, confidence: float) -> int:
    """Samples without a change that show a change rate below 1 - `floor` at `confidence`."""
    if floor <= 0.0:
        return 1
    if floor >= 1.0:
        raise ValueError("a floor of 1 is never shown by a sample")
    return math.ceil(math.log(1.0 - confidence) / math.log(floor) - 1e-9)


def _pct(share: float) -> str:
    return f"{100 * share:.3g}%"


@dataclass(frozen=True)
class Shows:
    """What an agreement over `samples`, `changed` of them, shows at `confidence` against `floor`."""

    samples: int
    changed: int
    floor: float
    confidence: float

    @cached_property
    def at_most(self) -> float:
        return upper_rate(self.changed, self.samples, self.confidence)

    @property
    def unseen_at_floor(self) -> float:
        return unseen(1.0 - self.floor, self.samples)

    @property
    def needed(self) -> int | None:
        return samples_needed(self.floor, self.confidence) if self.floor < 1.0 else None

    def words(self) -> str:
        """The statement in plain words.

        >>> for part in Shows(32, 0, 0.99, 0.975).words().split("; "):
        ...     print(part)
        0 of 32 samples changed: 97.5% sure at most 10.9% of unseen samples change
        a 1% change rate goes unseen 72 times in 100 on 32 samples
        the floor 0.99 needs 368 samples without a change (--eval-data DIR supplies them)
        """
        rate = 1.0 - self.floor
        text = (f"{self.changed} of {self.samples} samples changed: {_pct(self.confidence)} sure at most "
                f"{_pct(self.at_most)} of unseen samples change")
        if rate > 0:
            text += (f"; a {_pct(rate)} change rate goes unseen {round(100 * self.unseen_at_floor)} times in 100 "
                     f"on {self.samples} samples")
        if self.needed is not None and self.needed > self.samples:
            text += (f"; the floor {self.floor:g} needs {self.needed} samples without a change "
                     "(--eval-data DIR supplies them)")
        return text

    def to_dict(self) -> dict:
        return {"samples": self.samples, "changed": self.changed, "confidence": self.confidence,
                "at_most": round(self.at_most, 6), "unseen_at_floor": round(self.unseen_at_floor, 6),
                "samples_needed": self.needed, "words": self.words()}
