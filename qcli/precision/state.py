"""One search's state, shared by its steps (qcli.precision.search) and its ranking
(qcli.precision.ranking): the candidates measured, the promotions tried, what was found."""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace
from typing import cast

from qcli.analyze.fidelity import Fidelity
from qcli.config import HALF_PRECISIONS
from qcli.precision.goal import Goal
from qcli.precision.steps import SearchResult, SearchTrials, Step, StepKind
from qcli.precision.units import Choice, Choices, Costs, Unit


@dataclass(frozen=True)
class Point:
    """A candidate and what was measured of it."""

    choices: Choices
    fidelity: Fidelity | None
    ratio: float | None = None


@dataclass(frozen=True)
class Promotions:
    """Candidates made of fixed choices plus some units, each promoted to its own precision;
    `ranked`: the units in the order they are added (most useful first)."""

    fixed: Choices
    to: dict[str, Choice]
    ranked: list[str] = field(default_factory=list)

    def promoting(self, nodes: list[str]) -> Choices:
        return {**self.fixed, **{n: self.to[n] for n in nodes}}

    def prefix(self, k: int) -> Choices:
        """The first `k` ranked units promoted."""
        return self.promoting(self.ranked[:k])


@dataclass
class SearchState:
    """One search's state, shared by its phases: what it measures with and against, and what it
    has found (the steps, the sensitivities). `scale`: the share of the accuracy budget aimed at."""

    trials: SearchTrials
    goal: Goal
    costs: Costs
    units: list[Unit]  # the promotable ones (a candidate precision exists), in graph order
    index: dict[str, int]  # unit -> graph position (steps list units in graph order)
    weighted: list[str] = field(default_factory=list)  # units with a constant weight (int4 candidates)
    params: dict[str, int] = field(default_factory=dict)  # weighted unit -> its weights' elements
    scale: float = 1.0
    instead: Callable[[Choices, bool], Fidelity | None] | None = None  # the caller's better model's (settled?)
    missed: Choices | None = None  # the candidate `_needs_most` found missing the goal (quick): no finer blocks
    guessed: bool = False  # the ranking is the noisiest half's guess (qcli.precision.ranking.rank)
    steps: list[Step] = field(default_factory=list)
    sensitivity: dict[str, float] = field(default_factory=dict)

    @property
    def cheapest(self) -> dict[str, Choice]:
        """Each unit's cheapest promotion (measured)."""
        return {u.node: self.costs[u.node][0] for u in self.units}

    def back(self, nodes: Collection[str]) -> str:
        """The prune's step text for taking `nodes` back to their configured precision."""
        kinds = {"16-bit float" if u.half else "int8" for u in self.units if u.node in nodes}
        return "back to " + " / ".join(sorted(kinds, reverse=True))  # int8 first

    def smaller(self, candidates: Collection[str] | None) -> dict[str, Choice]:
        """What the accuracy search tries each promoted unit in before float: dynamic for the
        units with a dynamic form (int8 weights, 4x smaller than float; a fixed rule, so timing
        noise cannot flip it, and the result's latency is checked like any other), else the
        cheapest promotion measured; where that is float, a float16/bfloat16 candidate (half the
        bytes of float, and a speed CPU cannot show: also a fixed rule)."""
        dynamic = candidates is not None and "dynamic" in candidates
        half = next((cast(Choice, c) for c in candidates or () if c in HALF_PRECISIONS), None)
        cheapest = self.cheapest
        return {u.node: "dynamic" if dynamic and u.dynamic
                else half if half and cheapest[u.node] == "float" and not (u.half or u.table)
                else cheapest[u.node] for u in self.units}

    def small(self, choices: Choices) -> bool:
        """Whether `choices` fit the size budget (built and counted only when there is one)."""
        return self.goal.max_bytes is None or self.goal.small(self.trials.size(choices))

    def all_float(self, choices: Choices) -> bool:
        """Whether `choices` promote every unit to float (computing like the float model)."""
        return len(choices) == len(self.units) and all(p == "float" for p in choices.values())

    def scaled(self, scale: float) -> SearchState:
        """The same search aiming at `scale` times the budget (the steps and sensitivities shared)."""
        return replace(self, scale=scale)

    def accurate(self, f: Fidelity | None) -> bool:
        return self.goal.accurate(f, self.scale)

    def log(self, kind: StepKind, action: str, changed: list[str], chosen: Choices, f: Fidelity | None,
            ratio: float | None = None, kept: bool = True, quick: bool = False) -> None:
        self.steps.append(Step(kind, action, sorted(changed, key=lambda n: self.index[n]), len(chosen),
                               f.drop if f else None, f.noise if f else None, ratio, kept, quick,
                               min((o.samples for o in f.outputs), default=None) if f else None))

    def result(self, at: Point, met: bool) -> SearchResult:
        choices = dict(sorted(at.choices.items(), key=lambda kv: self.index[kv[0]]))
        return SearchResult(choices, at.fidelity, at.ratio, met, self.steps, self.sensitivity, self.costs,
                            self.trials.count, self.trials.stopped)
