"""Whether a gated figure meets its floor, given that it was measured on a sample
(README "Verification": a verdict with its uncertainty).

A figure measured on n samples is an estimate; its ~95% interval (qcli.analyze.metrics) says
where the same model could land on samples it never saw. The rule:
- the interval at or above the floor: met; entirely below it: missed;
- an agreement whose interval straddles the floor (16 of 16 samples agreeing gives [0.806, 1]
  against 0.99): met when its value reaches the floor and the output's continuous noise says
  the outputs are close, that is, the interval of its mean cosine is at or above `min_cosine`
  (an agreement without a cosine, an integer output's: missed);
- a cosine whose interval straddles its floor: missed (the cosine is the continuous figure;
  nothing finer can decide).
More samples narrow the intervals (`verify.samples`, `--eval-data`); verification does not
fetch more on its own (every candidate would have to be measured on them again).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from qcli.analyze.probe import Fidelity, OutputFidelity

Interval = tuple[float, float]


@dataclass(frozen=True)
class Verdict:
    metric: str  # "top-1 agreement", "sequence agreement", ..., "cosine"
    output: str
    value: float
    floor: float
    interval: Interval | None
    samples: int
    passed: bool
    how: str  # how the rule decided, in words

    @property
    def straddles(self) -> bool:
        return self.interval is not None and self.interval[0] < self.floor <= self.interval[1]


def agreement_verdict(o: OutputFidelity, metric: str, value: float, floor: float, min_cosine: float | None) -> Verdict:
    """The verdict on an output's agreement (module docstring)."""
    interval = o.agreement_interval
    if interval is None or interval[0] >= floor:
        passed = value >= floor
        return Verdict(metric, o.name, value, floor, interval, o.samples, passed, _clear(interval, value, floor))
    if interval[1] < floor or value < floor:
        return Verdict(metric, o.name, value, floor, interval, o.samples, False, "below the floor")
    cos = o.cosine_interval
    if cos is None or min_cosine is None:
        return Verdict(metric, o.name, value, floor, interval, o.samples, False,
                       "its interval reaches below the floor and the output has no cosine to decide")
    close = cos[0] >= min_cosine
    how = (f"its interval reaches below the floor; its cosine ({cos[0]:.4f}-{cos[1]:.4f}) "
           f"{'is' if close else 'is not'} clear of {min_cosine:g}")
    return Verdict(metric, o.name, value, floor, interval, o.samples, close, how)


def cosine_verdict(o: OutputFidelity, value: float, floor: float) -> Verdict:
    """The verdict on an output's mean cosine (module docstring)."""
    interval = o.cosine_interval
    passed = value >= floor if interval is None else interval[0] >= floor
    how = _clear(interval, value, floor) if interval is None or interval[1] < floor or passed else \
        "its interval reaches below the floor"
    return Verdict("cosine", o.name, value, floor, interval, o.samples, passed, how)


def _clear(interval: Interval | None, value: float, floor: float) -> str:
    if interval is None:
        return "met" if value >= floor else "below the floor"
    return "its interval is clear of the floor" if interval[0] >= floor else "below the floor"


def verdicts(f: Fidelity, min_agreement: float | None, min_cosine: float | None) -> list[Verdict]:
    """One verdict per gated figure of every output (agreements, then cosines)."""
    from qcli.analyze.probe import AGREEMENT

    out = []
    if min_agreement is not None:
        out += [agreement_verdict(o, AGREEMENT[o.kind], a, min_agreement, min_cosine)
                for o in f.outputs if (a := o.gated_agreement) is not None]
    if min_cosine is not None:
        out += [cosine_verdict(o, c, min_cosine) for o in f.outputs if (c := o.gated_cosine) is not None]
    return out


def meets(f: Fidelity, min_agreement: float | None, min_cosine: float | None) -> bool:
    """Whether every gated figure of `f` meets its floor by the rule (the plug-in's score aside)."""
    return all(v.passed for v in verdicts(f, min_agreement, min_cosine))
