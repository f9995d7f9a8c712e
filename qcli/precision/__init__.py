"""Automatic mixed precision: measured sensitivity, measured speed cost, then a cheap search.

units.py   the compute nodes decided on, and the config that writes the choices as overrides
trials.py  candidates built and measured once each (fidelity, latency, kernel times), on workers
goal.py    what the result must satisfy (accuracy budget, floors, latency ceiling)
search.py  the search for the fewest promotions that meet the goal, in steps
ranking.py its ranking: each unit's measured sensitivity (one at a time, or by blocks)
state.py   one search's state, shared by the two
steps.py   what a search records (its steps, its result) and measures with
reasons.py why it promoted each unit, in words
"""

from __future__ import annotations

from qcli.precision.goal import Criterion, Goal, goal_of
from qcli.precision.ranking import BLOCKS
from qcli.precision.search import PRUNE_ONE_BY_ONE, search
from qcli.precision.steps import SearchResult, SearchTrials, Step, StepKind
from qcli.precision.trials import SPEED_TIE, Trials, attribute
from qcli.precision.units import (
    CHOICES,
    PROMOTIONS,
    Choice,
    Choices,
    Costs,
    Promotion,
    Unit,
    find_units,
    promoted_config,
)

__all__ = [
    "BLOCKS", "CHOICES", "PROMOTIONS", "PRUNE_ONE_BY_ONE", "SPEED_TIE", "Choice", "Choices", "Costs", "Criterion",
    "Goal", "Promotion", "SearchResult", "SearchTrials", "Step", "StepKind", "Trials", "Unit", "attribute",
    "find_units", "goal_of", "promoted_config", "search",
]
