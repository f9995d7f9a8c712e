"""The size budget (`auto_precision.max_size_mb`): int4 weights where they add the least noise,
until the written model fits.

Each unit's int4 weights are measured once for the output noise they add (the search's quick
trials, `search._shrink`) and priced in bytes at the mean a weight saves when every unit is int4
(built and counted: scales included, so per-channel int4 after 8-bit blocks saves more than half a
byte). The units taken are those of least summed noise whose savings reach the bytes over the
budget: a 0/1 knapsack, solved exactly on the savings in `BUCKETS` steps (each rounded down, so
the estimate never overstates them). The choice is then built and counted (a build, not a trial);
short of the budget, the bytes still over are added to what it must save and it is solved again.
Why not a ranking's prefix: by noise alone it takes many small layers for a few bytes each; by
noise per byte it takes the largest layer (the output projection) early, whose int4 weights are
cheap per byte but add the most noise of all. The knapsack weighs both. Tried on the trained
decoder of `make llm-models` (llm-mixed, 4 and 3 MB budgets), with the shortest prefix of each
ranking that fits beside it, all three measured: the knapsack's choice had the least perplexity
increase on the quick probe each time (4 MB: +0.069% vs +0.079%, one prefix the knapsack's own
choice; 3 MB: +0.37% vs +0.38% and +0.45%), so it alone is measured.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from qcli.precision.state import Point, SearchState
from qcli.precision.steps import StepKind
from qcli.precision.units import Choices

BUCKETS = 4096  # the savings' resolution: a step is 1/BUCKETS of the bytes to save
UNMEASURED = 1e9  # the noise of a unit its int4 candidate could not be measured for: taken last


def fit(s: SearchState, here: Point, added: dict[str, float], budget: int) -> Point:
    """`here` with int4 weights on units of `added` (unit -> the noise its int4 weights add) of
    least summed noise that bring the written model within `budget` bytes; logged, measured on
    all samples. The caller knows it needs some, and that all of them fit (`needs_int4`)."""
    pool = list(added)
    size = s.trials.size(here.choices)
    everything: Choices = {**here.choices, **dict.fromkeys(pool, "int4")}
    rate = (size - s.trials.size(everything)) / max(sum(s.params.get(n, 0) for n in pool), 1)
    noise = [min(added[n], UNMEASURED) for n in pool]
    saved = [s.params.get(n, 0) * rate for n in pool]
    need, chosen = size - budget, here.choices
    while size > budget:  # ends: the knapsack takes every unit once `need` passes their savings
        taken = least_noise(noise, saved, need)
        chosen = {**here.choices, **dict.fromkeys((pool[i] for i in taken), "int4")}
        size = s.trials.size(chosen)
        need += max(size - budget, 0)
    f = s.trials.fidelity(chosen)
    r = s.trials.latency(chosen) if s.goal.max_latency_ratio is not None else None
    changed = [n for n in chosen if n not in here.choices]
    s.log(StepKind.INT4, f"int4 weights on {len(changed)}, the least noise that fits {mb(budget)} ({mb(size)})",
          changed, chosen, f, r)
    return Point(chosen, f, r if r is not None else here.ratio)


def needs_int4(s: SearchState, here: Point, everything: Choices) -> bool:
    """Whether the budget needs some units int4, not none or all: `here` is over it and int4
    weights on every unit fit it (else logged, and no trial spent on measuring the units)."""
    budget, size = s.goal.max_bytes or 0, s.trials.size(here.choices)
    if size <= budget:
        s.log(StepKind.INT4, f"fits {mb(budget)} without int4 weights ({mb(size)})", [], here.choices,
              here.fidelity, here.ratio)
        return False
    return s.trials.size(everything) <= budget


def all_int4(s: SearchState, here: Point, everything: Choices) -> Point:
    """A budget not even int4 weights on every unit meet: that model, the smallest, measured (the
    search's best, which misses the goal)."""
    f = s.trials.fidelity(everything)
    r = s.trials.latency(everything) if s.goal.max_latency_ratio is not None else None
    changed = [n for n in everything if n not in here.choices]
    s.log(StepKind.INT4, f"int4 weights on all {len(changed)}: {mb(s.trials.size(everything))}, still over "
          f"{mb(s.goal.max_bytes or 0)}", changed, everything, f, r)
    return Point(everything, f, r if r is not None else here.ratio)


def least_noise(noise: Sequence[float], saved: Sequence[float], need: float) -> list[int]:
    """The items (indices, ascending) of least summed `noise` whose summed `saved` reaches
    `need`; all of them when even they fall short. Exact on the savings in BUCKETS steps of
    `need`, each item's rounded down.

    >>> least_noise([5.0, 1.0, 1.0, 3.0], [10.0, 4.0, 4.0, 9.0], 8.0)
    [1, 2]
    >>> least_noise([5.0, 1.0, 1.0, 3.0], [10.0, 4.0, 4.0, 9.0], 9.0)
    [3]
    >>> least_noise([1.0], [2.0], 5.0)
    [0]
    """
    if need <= 0:
        return []
    step, top = need / BUCKETS, BUCKETS
    best = np.full(top + 1, np.inf)  # best[j]: least noise of a choice saving j steps (top: at least top)
    best[0] = 0.0
    came = np.zeros((len(noise), top + 1), np.int32)  # the state item i was added to, where it was
    took = np.zeros((len(noise), top + 1), bool)
    for i, (cost, gain) in enumerate(zip(noise, saved, strict=True)):
        w = min(int(gain // step), top)
        moved = np.full(top + 1, np.inf)
        origin = np.arange(top + 1, dtype=np.int32) - w
        moved[w:] = best[: top + 1 - w] + cost
        if w:  # the states this item carries past `top`: the best of them lands on `top`
            j = top + 1 - w + int(np.argmin(best[top + 1 - w:]))
            if best[j] + cost < moved[top]:
                moved[top], origin[top] = best[j] + cost, j
        took[i] = moved < best
        came[i] = origin
        best = np.where(took[i], moved, best)
    if not np.isfinite(best[top]):
        return list(range(len(noise)))
    taken, j = [], top
    for i in range(len(noise) - 1, -1, -1):
        if took[i, j]:
            taken.append(i)
            j = int(came[i, j])
    return sorted(taken)


def mb(size: int) -> str:
    """Bytes in MB (10^6), as the budget is given.

    >>> mb(3_012_345)
    '3.01 MB'
    """
    return f"{size / 1e6:.3g} MB"
