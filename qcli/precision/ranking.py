"""The accuracy search's ranking: each int8 unit's sensitivity (the output noise promoting it
removes, measured on the quick probe), one unit at a time when the trial budget allows, else
by contiguous blocks; and which units to promote to their dynamic form before float."""

from __future__ import annotations

from collections.abc import Callable

from qcli.precision.state import Promotions, SearchState
from qcli.precision.steps import StepKind
from qcli.precision.units import Choice, Choices

DYNAMIC_SHARE = 0.75  # dynamic goes first when it removes this share of the error float removes


def rank(s: SearchState, promote: Promotions, cheaper: dict[str, Choice],
         guess: bool = True) -> tuple[list[str], dict[str, Choice]]:
    """The int8 units, most sensitive first (sensitivity measured on the quick probe, recorded
    in `s.sensitivity`), and the units whose dynamic form removes at least DYNAMIC_SHARE of the
    error their float form removes (each measured alone when the budget allows one trial per
    unit and form, else all together). By sensitivity, not by cost: costs are timings, and ranking by them would
    make the promotions depend on a busy machine. Units the budget left unmeasured (or below
    the noise floor) come last, in graph order. With the caller's better model to ask
    (`s.instead`) and `guess`, the noisiest half asks first whether the goal needs most units
    (qcli.precision.noise: on the quick probe before blocks, on all samples before one trial
    per unit, where the quick probe flatters it); when it does, the ranking is that guess
    (`s.guessed`), for the caller to ask its model about everything promoted, and to rank
    again without `guess` (and without `s.missed`: the blocks ask their own question) if that
    model is refused."""
    choices = promote.fixed
    left = [u.node for u in s.units if u.node not in choices]
    dynamic = [n for n in left if cheaper.get(n) == "dynamic" and promote.to[n] != "dynamic"]
    here = s.trials.fidelity(choices, quick=True)
    base_noise = here.noise if here else float("inf")
    floor = 1e-3 * max(base_noise, 1e-12)  # gains below this are measurement noise
    spread: dict[str, int] = {}

    def gain(nodes: list[str]) -> float | None:
        trial = promote.promoting(nodes)
        f = s.trials.fidelity(trial, quick=True)
        if f is None:
            return None
        spread[nodes[0]] = max(s.trials.demoted(trial) - s.trials.demoted(choices), 1)
        return base_noise - f.noise

    smaller: dict[str, Choice] = {}
    per_unit = s.trials.affordable(len(left) + len(dynamic))
    # one unit at a time, the quick probe flatters the noisiest half (magika: it holds on 8 samples,
    # where 28 of 31 units are needed on 32): asked on all samples there. Before blocks, on the
    # quick probe: on all samples the direction classifier's half held by the verdict rule where
    # one flip in 8 missed, and its blocks took 48 trials instead of 6 (the same bytes)
    known = _guess(s, choices, left, promote, quick=not per_unit) if guess and s.instead is not None else None
    s.guessed = bool(known)
    if not known:
        for n in left:  # a guess ranked before: measured now
            s.sensitivity.pop(n, None)
    if known:
        action = ("sensitivity by each unit's own noise (one run): the goal needs more than half of the units "
                  f"(the noisiest half misses it{' on all samples' if per_unit else ''})")
    elif per_unit:
        action = "sensitivity"  # of each unit in float, and in its dynamic form when it has one
        alone = [{**choices, n: "dynamic"} for n in dynamic]
        s.trials.fidelity_many([promote.promoting([n]) for n in left] + alone, quick=True)  # in parallel
        for n in left:
            g = gain([n])
            if g is not None:
                s.sensitivity[n] = g / spread[n]  # per unit actually left unquantized
        for n, trial in zip(dynamic, alone, strict=True):
            f, g = s.trials.fidelity(trial, quick=True), s.sensitivity.get(n)
            if f is not None and g is not None and g > 0 and base_noise - f.noise >= DYNAMIC_SHARE * g * spread[n]:
                smaller[n] = "dynamic"
    else:
        action = "sensitivity by blocks (one trial per unit does not fit the trial budget)"
        s.sensitivity.update(_block_sensitivity(s, left, gain, floor, promote, known))
        if s.missed is not None:
            action += ("; the goal needs more than half of the units (the most sensitive blocks miss it): "
                       "no finer blocks")
    if dynamic and not per_unit:  # the dynamic forms judged together: two trials
        as_dynamic: Choices = {**choices, **dict.fromkeys(dynamic, "dynamic")}
        together = [as_dynamic, promote.promoting(dynamic)]
        fd, ff = s.trials.fidelity_many(together, quick=True)
        if fd is not None and ff is not None and base_noise - fd.noise >= DYNAMIC_SHARE * (base_noise - ff.noise):
            smaller = {n: "dynamic" for n in dynamic}
    s.log(StepKind.SENSITIVITY, action, [], choices, here, quick=True)
    measured = [n for n in left if s.sensitivity.get(n, 0.0) > floor / len(left)]
    ranked = sorted(measured, key=lambda n: (-s.sensitivity[n], s.index[n]))
    return ranked + [n for n in left if n not in ranked], smaller


BLOCKS = 8  # the first split of the units into contiguous blocks; later splits: 4


def _guess(s: SearchState, choices: Choices, left: list[str], promote: Promotions, quick: bool) -> bool | None:
    """Whether the goal needs more than half of the units, by the noisiest half (each unit's own
    noise, one run: qcli.precision.noise) promoted: one trial, on the quick probe or on all
    samples (`quick`). When it does, `s.sensitivity` is the noise (the ranking is that guess).
    None: no guess (the noise run could not run)."""
    unit_noise = getattr(s.trials, "unit_noise", None)
    noise = unit_noise(choices, left) if unit_noise is not None else None
    if noise is None:
        return None
    noisiest = _noisiest(s, left, noise)
    if not _needs_most(s, noisiest, promote, len(left), quick):
        return False
    s.sensitivity.update({n: g for g, (n,) in noisiest})
    return True


def _noisiest(s: SearchState, left: list[str], noise: dict[str, float]) -> list[tuple[float, list[str]]]:
    """(noise, [unit]) of every unit, noisiest first (graph order among equals; units without
    a figure last): what `_needs_most` takes the first half of."""
    return [(noise.get(n, 0.0), [n]) for n in sorted(left, key=lambda n: (-noise.get(n, 0.0), s.index[n]))]


def _block_sensitivity(s: SearchState, left: list[str], gain: Callable[[list[str]], float | None], floor: float,
                       promote: Promotions, known: bool | None = None) -> dict[str, float]:
    """Sensitivity by bisection over contiguous blocks of units (graph order): promote each
    block, keep splitting the blocks whose gain is at least a tenth of the best one's (at most
    3 per level). About 8 + 12 log4(N) trials instead of N. A unit's score is its finest
    measured block's gain shared among the block's units. A level after the first runs only
    when it fits in half of what is left of the budget (`trials.affordable`): the prefix
    search and the prune need the rest; and only when the goal does not need most units
    (`_needs_most`; `known`: the answer when it is known already, from the noisiest half, so
    that the first level does not ask again and the trials stay as many as before)."""
    def split(nodes: list[str], parts: int) -> list[list[str]]:
        size = max(1, -(-len(nodes) // parts))  # no units left to rank: no blocks
        return [nodes[i: i + size] for i in range(0, len(nodes), size)]

    scores: dict[str, float] = {}
    frontier, first = split(left, BLOCKS), True
    while frontier and not s.trials.exhausted():
        s.trials.fidelity_many([promote.promoting(block) for block in frontier], quick=True)
        measured = []
        for block in frontier:
            if s.trials.exhausted():
                break
            g = gain(block)
            if g is None:
                continue
            measured.append((g, block))
            for n in block:
                scores[n] = g / len(block)
        measured.sort(key=lambda gb: -gb[0])
        if first and measured and (known if known is not None else _needs_most(s, measured, promote, len(left))):
            break
        first = False
        best = measured[0][0] if measured else 0.0
        frontier = [part for g, block in measured[:3] if g > max(floor, best / 10) and len(block) > 1
                    for part in split(block, 4)]
        if not s.trials.affordable(len(frontier)):
            break
    return scores


def _needs_most(s: SearchState, measured: list[tuple[float, list[str]]], promote: Promotions, total: int,
                quick: bool = True) -> bool:
    """Whether the goal needs more than half of the units: the most sensitive first-level
    blocks (`measured`, by gain) that hold half of the `total` units, promoted, miss it on the
    quick probe (one trial; on all samples without `quick`, stopped once it must miss). The
    prefix search will then promote more than those blocks whatever the order within them, so
    finer blocks would not pay for their trials."""
    top: list[str] = []
    for _, block in measured:
        if 2 * len(top) >= total:
            break
        top += block
    f = s.trials.fidelity(promote.promoting(top), quick=quick, stop_below=None if quick else s.goal.stop_below)
    if s.accurate(f):
        return False
    s.missed = promote.promoting(top)
    return True
