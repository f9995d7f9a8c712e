"""Automatic mixed precision: measured sensitivity, measured speed cost, then a cheap search.

units.py   the compute nodes decided on, and the config that writes the choices as overrides
trials.py  candidates built and measured once each (fidelity, latency, kernel times), on workers
search.py  the goal, and the search for the fewest promotions that meet it
"""

from __future__ import annotations

from qcli.precision.search import BLOCKS, PRUNE_ONE_BY_ONE, Goal, SearchResult, Step, goal_of, search
from qcli.precision.trials import SPEED_TIE, Trials, attribute
from qcli.precision.units import PROMOTIONS, Unit, find_units, promoted_config

__all__ = [
    "BLOCKS", "PROMOTIONS", "PRUNE_ONE_BY_ONE", "SPEED_TIE", "Goal", "SearchResult", "Step", "Trials", "Unit",
    "attribute", "find_units", "goal_of", "promoted_config", "search",
]
