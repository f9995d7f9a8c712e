"""Why the search promoted each unit, in words: for the quantize summary, `--json`'s
`precision.promoted`, and the plan's node table (`in_plan`); read from the kind of the first
kept step that promoted it and what the search measured of it."""

from __future__ import annotations

from enum import Enum

from qcli.precision.steps import SearchResult, Step, StepKind


class Why(Enum):
    """Why the search promoted a unit (its reason says it in words)."""

    INT4 = "int4"  # int4 weights: among those adding the least noise
    FASTER = "faster"  # int8 ran slower
    SENSITIVE = "sensitive"  # promoting it alone cuts the output noise
    WITH_RANKED = "with ranked"  # promoted with the units ranked above it, not sensitive alone
    UNMEASURED = "unmeasured"  # the budget ran out before it was measured: promoted by rank
    ALL_DYNAMIC = "all dynamic"  # every unit with a dynamic form dynamic met the goal
    NO_PAYOFF = "no payoff"  # all int8 missed the goal, and no mix could pay off: not searched


def in_plan(why: Why, was: str) -> str:
    """Why the search promoted a node that ran in `was` ("8 bits", "float16"), as the plan's
    node table says it."""
    return {Why.FASTER: "faster in float", Why.SENSITIVE: f"sensitive to {was}",
            Why.NO_PAYOFF: "int8 would not pay off here"}.get(why, "promoted")


def whys(found: SearchResult) -> dict[str, tuple[Why, str]]:
    """Why each unit the search chose was promoted, from the first kept step that promoted it."""
    whys: dict[str, tuple[Why, str]] = {}
    for step in found.steps:
        if step.kept:
            for n in step.changed:
                if n in found.choices and n not in whys:
                    why, text = _why(found, step, n)
                    if found.choices[n] == "dynamic" and why not in (Why.FASTER, Why.ALL_DYNAMIC):
                        text += "; dynamic int8 (activations quantized at run time) meets the goal: not float"
                    whys[n] = why, text
    return whys


def _why(found: SearchResult, step: Step, n: str) -> tuple[Why, str]:
    if found.choices[n] == "int4":
        return Why.INT4, "int4 weights: among the nodes whose 4-bit weights add the least output noise"
    if step.kind is StepKind.ALL_DYNAMIC:
        return Why.ALL_DYNAMIC, ("dynamic int8 (activations quantized at run time), as every node with a dynamic form: "
                                 "that meets the goal where static int8 did not, nothing float")
    if step.kind is StepKind.NO_PAYOFF:
        return Why.NO_PAYOFF, step.action
    if step.kind is StepKind.SPEED:
        precision, cost = found.costs.get(n, ("float", 0.0))
        return Why.FASTER, f"faster in {precision} ({-cost:.1f} µs less per run)"
    gain = found.sensitivity.get(n)
    if gain is None:
        return Why.UNMEASURED, "not measured (budget spent): promoted by rank"
    if gain <= 0:  # ranked last; the goal still needed it (or everything)
        return Why.WITH_RANKED, (f"promoted with the units ranked above it (alone it changes output "
                                 f"noise by {0.0 - gain:+.3g}: not sensitive by itself)")
    return Why.SENSITIVE, f"sensitive: promoting it alone cuts output noise by {gain:.3g}"


def reasons(found: SearchResult) -> dict[str, str]:
    """Why each promoted unit was promoted, in words."""
    return {n: text for n, (_, text) in whys(found).items()}
