"""What a precision search records (its steps and result) and what it measures with: shared by
the search (qcli.precision.search), verification's report of it and the reasons it gives
(qcli.precision.reasons)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from qcli.analyze.fidelity import Fidelity
from qcli.precision.units import Choices, Costs


class StepKind(Enum):
    """What a search step did; its `action` says it in words (for the report)."""

    ALL_INT8 = "all int8"  # the starting point
    ALL_DYNAMIC = "all dynamic"  # every unit with a dynamic form in it, the rest as configured
    SPEED = "speed"  # units promoted because int8 runs slower
    SENSITIVITY = "sensitivity"  # the int8 units measured and ranked
    PREFIX = "prefix"  # the first units of the ranking promoted
    CONFIRM = "confirm"  # a result on the quick probe checked on all samples
    PRUNE = "prune"  # promoted units tried back at int8
    CHEAPER = "cheaper"  # promoted units tried in their cheaper promotion
    BEST_REACHABLE = "best reachable"  # the goal out of reach: everything promoted
    NO_PAYOFF = "no payoff"  # no mix of int8 and float could pay off: everything promoted, unsearched
    INT4 = "int4"  # weights tried at int4


@dataclass
class Step:
    kind: StepKind
    action: str  # what the step did, in words (for the report)
    changed: list[str]  # units whose precision this step changed
    promoted: int  # units promoted after the step
    drop: float | None
    noise: float | None
    latency_ratio: float | None = None
    kept: bool = True
    quick: bool = False  # measured on the quick probe's few samples
    samples: int | None = None  # the samples its figures cover (a confirmation that must miss stops early)


@dataclass
class SearchResult:
    choices: Choices
    fidelity: Fidelity | None
    latency_ratio: float | None
    met: bool
    steps: list[Step]
    sensitivity: dict[str, float]
    costs: Costs
    trials: int
    stopped: str | None = None


class SearchTrials(Protocol):
    """What the search measures with: `Trials`, or a stand-in (the tests' synthetic models)."""

    count: int  # trials run so far
    stopped: str | None  # why the budget ran out, once it has

    def fidelity(self, choices: Choices, quick: bool = False, stop_below: float | None = None) -> Fidelity | None: ...
    def fidelity_many(self, candidates: list[Choices], quick: bool = False) -> list[Fidelity | None]: ...
    def latency(self, choices: Choices) -> float: ...
    def size(self, choices: Choices) -> int: ...
    def demoted(self, choices: Choices) -> int: ...
    def exhausted(self) -> bool: ...
    def affordable(self, n: int) -> bool: ...
