"""Whether a gated figure meets its floor, given that it was measured on a sample
(docs/guides/verification.md: a verdict with its uncertainty).

A figure measured on n samples is an estimate; its ~95% interval (qcli.analyze.metrics) says
where the same model could land on samples it never saw. The rule:
- the interval at or above the floor: met; entirely below it: missed;
- an agreement whose interval straddles the floor (16 of 16 samples agreeing gives [0.806, 1]
  against 0.99): met when its value reaches the floor and so does the agreement a finer
  figure predicts for unseen samples: for top-1 and sequence outputs, the one the decisions'
  margins predict (qcli.analyze.margins; a sequence's, at most what its position agreement
  predicts: one changed position in 32 sequences of 40 predicts 0.969); an integer output's:
  missed;
- a cosine or a mask's or a map's IoU (a mean of each sample's) whose interval straddles its
  floor: missed; so is a detector's boxes matched (Wilson's interval over the boxes: too few
  boxes to show the floor)
  (each is the continuous figure: nothing finer can decide; a mask's cosine, which the
  background fills, does not);
- a regression's relative error, a ceiling: met when its whole interval is at or below it,
  else missed (the continuous figure again); so is a language model's perplexity increase
  (its interval from the chunks' differences of mean log-likelihood: qcli.analyze.tokens);
- its next-token agreement and KL, when a floor is set: the value decides (the positions of a
  chunk are not independent samples, so no interval is claimed).
More samples narrow the intervals (`verify.samples`, `--eval-data`); verification does not
fetch more on its own (every candidate would have to be measured on them again).
"""

from __future__ import annotations

from dataclasses import dataclass

from qcli.analyze.fidelity import AGREEMENT, Fidelity, OutputFidelity
from qcli.analyze.kinds import Kind

Interval = tuple[float, float]
CEILINGS = ("relative error", "perplexity increase", "next-token KL")  # the verdicts whose bound is a ceiling


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


# Where an interval lies against its floor, and how the verdict says it
_HOW = {"above": "its interval is clear of the floor", "below": "below the floor",
        "straddles": "its interval reaches below the floor"}


def _side(interval: Interval | None, value: float, floor: float) -> str:
    """"above" the floor, "below" it (the value or the whole interval), or "straddles" it."""
    low, high = interval if interval is not None else (value, value)
    return "above" if low >= floor else "below" if high < floor or value < floor else "straddles"


def agreement_verdict(o: OutputFidelity, metric: str, value: float, floor: float, min_cosine: float | None) -> Verdict:
    """The verdict on an output's agreement (module docstring)."""
    interval, side = o.agreement_interval, _side(o.agreement_interval, value, floor)
    cos = o.cosine_interval
    if side != "straddles":
        return Verdict(metric, o.name, value, floor, interval, o.samples, side == "above", _HOW[side])
    if o.predicted_agreement is not None:
        close = o.predicted_agreement >= floor
        how = (f"{_HOW[side]}; the margins of float's decisions and how far they moved predict "
               f"{o.predicted_agreement:.4f} on unseen samples, {'at or above' if close else 'below'} {floor:g}")
        return Verdict(metric, o.name, value, floor, interval, o.samples, close, how)
    if o.kind is Kind.BOXES:
        return Verdict(metric, o.name, value, floor, interval, o.samples, False,
                       f"{_HOW[side]}: {o.boxes} float boxes cannot show the floor (give samples with more objects "
                       "in them: --eval-data DIR)")
    if o.kind in (Kind.MASK, Kind.MAP):
        return Verdict(metric, o.name, value, floor, interval, o.samples, False,
                       f"{_HOW[side]}: a mean of each sample's IoU is the continuous figure, nothing finer decides")
    if cos is None or min_cosine is None:
        return Verdict(metric, o.name, value, floor, interval, o.samples, False,
                       f"{_HOW[side]} and the output has no cosine to decide")
    close = cos[0] >= min_cosine
    how = f"{_HOW[side]}; its cosine ({cos[0]:.4f}-{cos[1]:.4f}) {'is' if close else 'is not'} clear of {min_cosine:g}"
    return Verdict(metric, o.name, value, floor, interval, o.samples, close, how)


def cosine_verdict(o: OutputFidelity, value: float, floor: float) -> Verdict:
    """The verdict on an output's mean cosine (module docstring): met only above the floor."""
    side = _side(o.cosine_interval, value, floor)
    return Verdict("cosine", o.name, value, floor, o.cosine_interval, o.samples, side == "above", _HOW[side])


def error_verdict(o: OutputFidelity, value: float, ceiling: float, metric: str = "relative error",
                  interval: Interval | None = None) -> Verdict:
    """The verdict on a regression output's relative error (or `metric`, with its `interval`: a
    perplexity increase), a ceiling (module docstring): met only when its interval is clear below it."""
    interval = o.error_interval if metric == "relative error" else interval
    low, high = interval if interval is not None else (value, value)
    side = "above" if high <= ceiling else "below" if low > ceiling or value > ceiling else "straddles"
    how = {"above": "its interval is clear below the ceiling", "below": "above the ceiling",
           "straddles": "its interval reaches above the ceiling"}[side]
    return Verdict(metric, o.name, value, ceiling, interval, o.samples, side == "above", how)


def verdicts(f: Fidelity, min_agreement: float | None, min_cosine: float | None,
             max_error: float | None = None, max_perplexity: float | None = None,
             min_tokens: float | None = None, max_kl: float | None = None,
             min_spatial: float | None = None) -> list[Verdict]:
    """One verdict per gated figure of every output (agreements, cosines, relative errors, then
    a language model's perplexity increases, next-token agreements and KL divergences); a map's
    or a detector's agreement against `min_spatial` when given (`OutputFidelity.spatial`)."""
    out = []
    if min_agreement is not None:
        out += [agreement_verdict(o, AGREEMENT[o.kind], a, min_spatial if o.spatial and min_spatial is not None
                                  else min_agreement, min_cosine)
                for o in f.outputs if (a := o.gated_agreement) is not None]
    if min_cosine is not None:
        out += [cosine_verdict(o, c, min_cosine) for o in f.outputs if (c := o.gated_cosine) is not None]
    if max_error is not None:
        out += [error_verdict(o, e, max_error) for o in f.outputs if (e := o.gated_error) is not None]
    if max_perplexity is not None:
        out += [error_verdict(o, p, max_perplexity, "perplexity increase", o.perplexity_interval)
                for o in f.outputs if (p := o.gated_perplexity) is not None]
    tokens = [o for o in f.outputs if o.kind is Kind.TOKENS]
    if min_tokens is not None:
        out += [_point(o, "next-token agreement", a, min_tokens, True)
                for o in tokens if (a := o.token_agreement) is not None]
    if max_kl is not None:
        out += [_point(o, "next-token KL", k, max_kl, False) for o in tokens if (k := o.kl) is not None]
    return out


def _point(o: OutputFidelity, metric: str, value: float, bound: float, at_least: bool) -> Verdict:
    """A figure over every position of the compared text (a next-token agreement, a mean KL): the
    positions of a chunk are not independent samples, so no interval: the value decides."""
    passed = value >= bound if at_least else value <= bound
    how = "over every next token compared (positions of a chunk are not independent: no interval)"
    return Verdict(metric, o.name, value, bound, None, o.samples, passed, how)


def meets(f: Fidelity, min_agreement: float | None, min_cosine: float | None, max_error: float | None = None,
          max_perplexity: float | None = None, min_tokens: float | None = None, max_kl: float | None = None,
          min_spatial: float | None = None) -> bool:
    """Whether every gated figure of `f` meets its floor by the rule (the plug-in's score aside)."""
    return all(v.passed for v in verdicts(f, min_agreement, min_cosine, max_error, max_perplexity, min_tokens,
                                          max_kl, min_spatial))
