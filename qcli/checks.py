"""What verification reports: each floor checked against what was measured (the fidelity
by qcli.analyze.verdict's rule, the latency ratio with its tolerance), with notes, as
`qcli quantize` prints them and `--json` writes them (docs/guides/verification.md)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import onnx

from qcli.analyze.confidence import DEFAULT, Shows
from qcli.analyze.fidelity import AGREEMENT, Fidelity
from qcli.analyze.latency import Ratio
from qcli.analyze.probe import Probe
from qcli.analyze.report import rounded_pair
from qcli.analyze.verdict import CEILINGS, verdicts
from qcli.config import Config
from qcli.holdout import DataPlan
from qcli.precision import Goal

LATENCY_TOLERANCE = 0.03
# A predicted ratio has no noise, but the prediction has a resolution: a float model qcli
# rewrote (a Reshape folded, a Dropout gone) is predicted within a few tenths of a percent of
# the original; those are ties, not "slower"
PREDICTION_TOLERANCE = 0.01


@dataclass(frozen=True)
class Check:
    name: str
    value: float
    floor: float
    at_least: bool  # value >= floor (else value <= floor)
    passed: bool
    output: str | None = None  # the output the value comes from (the lowest of its kind)
    interval: tuple[float, float] | None = None  # its interval at verify.confidence (qcli.analyze.verdict)
    samples: int | None = None
    how: str = ""  # how the verdict was reached
    shows: Shows | None = None  # a share of samples: what they can show (qcli.analyze.confidence)

    @property
    def message(self) -> str:
        sign = ">=" if self.at_least else "<="
        verdict = "ok" if self.passed else "MISSED"
        within = f" [{self.interval[0]:.4f}, {self.interval[1]:.4f}] on {self.samples}" if self.interval else ""
        return f"{self.name} {self.value:.4f}{within} (floor {sign} {self.floor:g}): {verdict}"

    @property
    def missed(self) -> str:
        """Why a failed check failed, in words: by how much its value misses the floor, or, a value
        on the right side of it, how the verdict refused it (its interval reaches past the floor).

        >>> Check("top-1 agreement", 0.95, 0.99, True, False).missed
        'top-1 agreement 0.9500 misses its floor 0.99 by 0.0400'
        >>> Check("boxes matched", 1.0, 0.99, True, False, how="its interval reaches below the floor").missed
        'boxes matched 1.0000 is not shown to meet its floor 0.99: its interval reaches below the floor'
        """
        short = self.value < self.floor if self.at_least else self.value > self.floor
        if short or not self.how:
            return f"{self.name} {self.value:.4f} misses its floor {self.floor:g} by {abs(self.value - self.floor):.4f}"
        return f"{self.name} {self.value:.4f} is not shown to meet its floor {self.floor:g}: {self.how}"


@dataclass
class Verification:
    source: str
    samples: int
    fidelity: Fidelity
    latency_ratio: float | None
    float_ms: float | None
    checks: list[Check]
    notes: list[str] = field(default_factory=list)
    target: str | None = None  # what latency was judged on (qcli.target.deployment)
    measured: Ratio | None = None  # with a predicted verdict: this machine's A/B ratio, reported only
    confidence: float = DEFAULT  # verify.confidence: how sure a pass must be

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    def to_dict(self) -> dict:
        return {
            "data": self.source,
            "samples": self.samples,
            "passed": self.passed,
            "confidence": self.confidence,
            "metric": self.fidelity.metric,
            "drop": round(self.fidelity.drop, 6),
            "checks": [
                {"name": c.name, "output": c.output, "value": round(c.value, 6), "floor": c.floor,
                 "kind": "at_least" if c.at_least else "at_most", "passed": c.passed,
                 "interval": rounded_pair(c.interval),
                 "samples": c.samples, "how": c.how, "shows": c.shows.to_dict() if c.shows else None}
                for c in self.checks
            ],
            "outputs": [o.to_dict() for o in self.fidelity.outputs],
            "latency_ratio": None if self.latency_ratio is None else round(self.latency_ratio, 4),
            "latency_interval": _interval(self.latency_ratio),
            "float_ms": None if self.float_ms is None else round(self.float_ms, 4),
            "notes": self.notes,
            "target": self.target,
            "measured_latency": None if self.measured is None else {
                "ratio": round(self.measured, 4), **(_interval(self.measured) or {}),
                "how": "this machine, A/B at the target's batch; reported, never decides"},
        }


def _interval(ratio: float | None) -> dict | None:
    """A latency ratio's ~95% interval and its rounds (JSON), when it was measured in rounds."""
    if not isinstance(ratio, Ratio):
        return None
    return {"low": round(ratio.low, 4), "high": round(ratio.high, 4), "rounds": ratio.count}


def latency_ok(goal: Goal, ratio: float | None, exact: bool = False) -> bool:
    return tolerant(goal, exact).fast(ratio)


def fast_by_construction(floors: Goal, all_float: str | None, exact: bool = False) -> bool:
    """Whether a model with nothing quantized (`all_float`: the note saying so) meets the
    latency floor untimed, when timed (not `exact`: predicted, then it is judged like any,
    against the user's file, which preparation may have made slower): it computes like the
    float model, so a floor of at least 1 holds."""
    return (not exact and all_float is not None and floors.max_latency_ratio is not None
            and floors.max_latency_ratio >= 1.0)


def tolerant(goal: Goal, exact: bool = False) -> Goal:
    """The goal with the latency ceiling widened by the measurement's resolution (`exact`:
    a predicted ratio's, PREDICTION_TOLERANCE)."""
    if goal.max_latency_ratio is None:
        return goal
    widen = PREDICTION_TOLERANCE if exact else LATENCY_TOLERANCE
    return replace(goal, max_latency_ratio=goal.max_latency_ratio + widen)


def verification_of(plan: DataPlan, probe: Probe, f: Fidelity, ratio: float | None, floors: Goal,
                  config: Config, all_float: str | None = None) -> Verification:
    """The checks of `f` and `ratio` against the floors; `all_float`: the note saying why the
    model has no quantized node left, if so."""
    vf = config.verify
    checks = fidelity_checks(f, vf.min_top1_agreement, vf.min_cosine, vf.confidence, vf.max_relative_error,
                             vf.max_perplexity_increase, vf.min_token_agreement, vf.max_token_kl,
                             vf.min_spatial_agreement)
    notes: list[str] = []
    if all_float:
        notes.append(all_float)
    if probe.left_out:
        notes.append(f"{len(probe.left_out)} key/value cache outputs ({probe.left_out[0]}, ...) not compared: never "
                     "gated, the next step's logits show their error (name one in verify.outputs to compare it)")
    notes += [f"output {o.name!r}: the float model detects nothing on the {o.samples} samples compared, so its "
              "boxes check is empty; give samples with objects in them (--eval-data DIR)"
              for o in f.outputs if o.boxes == 0]
    exact = probe.predicts
    if ratio is not None and floors.max_latency_ratio is not None:
        checks.append(Check("latency ratio", ratio, floors.max_latency_ratio, False,
                            fast_by_construction(floors, all_float, exact) or latency_ok(floors, ratio, exact),
                            how="predicted by the target profile" if exact else "measured, A/B"))
        limit = floors.max_latency_ratio + LATENCY_TOLERANCE
        if not exact and isinstance(ratio, Ratio) and ratio > limit and ratio.low <= limit:
            notes.append(f"latency ratio {ratio:.3f} is above {limit:g} but not measurably: its 95% interval over "
                         f"{ratio.count} rounds is {ratio.low:.3f}-{ratio.high:.3f}")
    elif floors.max_latency_ratio is not None:  # applies, untimed: nothing is left quantized (`qcli.verify`)
        notes.append("latency ratio not timed: the model computes like the float model, so it holds the latency floor "
                     "by construction")
    elif vf.max_latency_ratio is not None:
        notes.append(
            f"latency floor not applied: the float model runs in {probe.float_ms():.3f} ms "
            f"(< verify.min_float_ms {vf.min_float_ms:g}), where per-node overhead decides the ratio"
        )
    step = ", a decode step after the prompt" if probe.decodes else ""
    target = probe.deployment.describe() + step + " against your model file as given" if probe.deployment else None
    # the float model's latency is reported where a floor reads it; with none set (`null`) it is not
    # predicted for the report alone: on a 368M-parameter decoder that took 23 s and 3.5 GB
    float_ms = probe.float_ms() if vf.max_latency_ratio is not None else None
    return Verification(plan.description, probe.samples, f, ratio, float_ms, checks, notes, target,
                        confidence=vf.confidence)


def memory_check(probe: Probe, model: onnx.ModelProto, floor: float) -> Check:
    """The weights onnxruntime holds to run the user's model / `model`'s (`Probe.held_bytes`:
    the graphs it runs, as `qcli analyze` reads them), against `floor`."""
    held, written = probe.held_bytes(model)
    value = round(held / max(written, 1), 4)
    return Check("memory reduction", value, floor, True, value >= floor,
                 how=f"weights onnxruntime holds to run them: {held / 1e6:.2f} MB for your model file, "
                     f"{written / 1e6:.2f} MB for the model written")


def fidelity_checks(f: Fidelity, min_agreement: float, min_cosine: float, confidence: float = DEFAULT,
                    max_error: float | None = None, max_perplexity: float | None = None,
                    min_tokens: float | None = None, max_kl: float | None = None,
                    min_spatial: float | None = None) -> list[Check]:
    """One check per metric the outputs are gated on (agreements against `min_agreement`,
    cosines against `min_cosine`, relative errors under `max_error`, each by
    qcli.analyze.verdict's rule), on the output of its kind that misses, else the worst, with
    what a share of samples can show at `confidence`; then the plug-in's."""
    checks = []
    found = verdicts(f, min_agreement, min_cosine, max_error, max_perplexity, min_tokens, max_kl, min_spatial)
    changed = {o.name: o.changed for o in f.outputs}
    for metric in (*AGREEMENT.values(), "cosine", "relative error", "perplexity increase", "next-token agreement",
                   "next-token KL"):
        mine = [v for v in found if v.metric == metric]
        if mine:
            at_least = metric not in CEILINGS
            v = min(mine, key=lambda v: (v.passed, v.value if at_least else -v.value))
            k = changed.get(v.output) if metric in AGREEMENT.values() else None
            shows = Shows(v.samples, k, v.floor, confidence) if k is not None else None
            checks.append(Check(metric, v.value, v.floor, at_least, v.passed, v.output, v.interval, v.samples,
                                v.how, shows))
    if f.custom is not None:
        checks.append(Check(f.custom.name, f.custom.score, f.custom.floor, True, f.custom.passed))
    return checks
