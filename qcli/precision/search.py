"""The search: the fewest promotions that meet the goal, found on measurements.

Sensitivity of a unit is the output noise (noise power / signal power against the float model)
it removes when promoted alone, everything else as deployed: measured at the outputs, so it
includes how the unit's error propagates, and continuous, so units do not tie. The accuracy
steps rank by sensitivity and promote to the most accurate candidate (float), never by timings,
so which units are promoted does not depend on how busy the machine was: the same model, data
and config give the same trials and choices. Only the steps that compare latencies (units
slower in int8, the `accuracy` criterion's speed floor, a cheaper candidate than float) depend
on timings, and the steps record them. docs/guides/mixed-precision.md describes the steps.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import replace

from qcli.analyze.fidelity import Fidelity
from qcli.precision.goal import Goal
from qcli.precision.ranking import rank
from qcli.precision.sizebudget import all_int4, fit, needs_int4
from qcli.precision.state import Point, Promotions, SearchState
from qcli.precision.steps import SearchResult, SearchTrials, StepKind
from qcli.precision.trials import SPEED_TIE
from qcli.precision.units import Choice, Choices, Costs, Unit


def search(units: list[Unit], trials: SearchTrials, goal: Goal, costs: Costs, shrink: bool = False,
           candidates: Collection[str] | None = None, dynamic_first: bool = False,
           no_payoff: str | None = None, instead: Callable[[Choices, bool], Fidelity | None] | None = None,
           ) -> SearchResult:
    """Find the choices meeting `goal` (docs/guides/mixed-precision.md): all int8 when that
    meets it; else units slower in int8 promoted (a missed latency ceiling), then the accuracy
    search; then, with `shrink`, int4 weights where they keep the goal. `candidates`: the
    promotions allowed; the accuracy search ranks and promotes with the most accurate of them
    (float), then tries each promoted unit in its cheaper one (default: the cheaper one from
    `costs` throughout). No unit in `costs` (no promotion among the candidates): the all-int8
    model is the result (int4 weights aside), met or not. `dynamic_first` (the verification
    rescue): when all int8 misses, every unit with a dynamic form dynamic is tried first
    (`_all_dynamic`), and is the result when it meets the goal. `no_payoff` (the rescue: why no
    mix of int8 and float could pay off, when none could): all int8 missing the goal, every unit
    is promoted at once, one trial (none when `instead` takes it), without a search. `instead`
    (the rescue): asked about each prefix of the accuracy search before it is confirmed
    (settled: False) and once it is (True; and about everything promoted when the goal needs
    most units, or no mix could pay off); a fidelity (the caller's better model's, which meets
    the goal) ends the search there, unpruned (`_settle`)."""
    promotable = [u for u in units if u.node in costs]
    s = SearchState(trials, goal, costs, promotable, {u.node: u.index for u in units},
                    [u.node for u in units if u.weighted], {u.node: u.params for u in units if u.weighted},
                    instead=instead)
    best: Choice | None = "float" if candidates is not None and "float" in candidates else None
    accurate = {n: best or p for n, p in s.cheapest.items()}  # what the accuracy search promotes to
    timed = goal.max_latency_ratio is not None
    # no payoff: everything goes float when all int8 misses the goal, its latency alone included
    here = Point({}, trials.fidelity({}), trials.latency({}) if timed else None)
    start = "all int8" if not units or not all(u.half for u in units) else "as configured (16-bit float)"
    s.log(StepKind.ALL_INT8, start, [], here.choices, here.fidelity, here.ratio)
    met = goal.accurate(here.fidelity) and goal.fast(here.ratio)
    if (met and goal.criterion != "accuracy") or not promotable:  # not promotable: no candidate promotes a unit
        here = _shrink(s, here) if shrink and met else here
        return s.result(here, met and _met(s, here))
    if no_payoff is not None:
        everything = dict(accurate)
        better = instead(everything, True) if instead is not None else None  # taken: it replaces everything
        f = better or trials.fidelity(everything)  # so everything float is then not measured
        s.log(StepKind.NO_PAYOFF, no_payoff, list(everything), everything, None if better else f)
        return s.result(Point(everything, f), goal.accurate(f) and s.all_float(everything))
    dynamic = _all_dynamic(s, candidates) if dynamic_first else None
    if dynamic is not None:
        here = _shrink(s, dynamic) if shrink else dynamic
        return s.result(here, _met(s, here))
    if timed and not goal.fast(here.ratio):
        here = _speed_up(s, here)
    if not goal.accurate(here.fidelity) or goal.criterion == "accuracy":
        here = _accuracy(s, here, Promotions(dict(here.choices), accurate), s.smaller(candidates))
        if timed:  # every unit float: as fast as float by construction, untimed
            untimed = s.all_float(here.choices) and goal.fast(1.0)
            here = replace(here, ratio=None if untimed else trials.latency(here.choices))
    if shrink and goal.accurate(here.fidelity) and goal.fast(here.ratio) and not trials.exhausted():
        here = _shrink(s, here)
    return s.result(here, _met(s, here))


def _met(s: SearchState, here: Point) -> bool:
    """Whether `here` meets the goal: accurate, fast (all float computes like the float model:
    as fast as it by construction) and within the size budget."""
    return (s.goal.accurate(here.fidelity) and (s.goal.fast(here.ratio) or s.all_float(here.choices))
            and s.small(here.choices))


def _all_dynamic(s: SearchState, candidates: Collection[str] | None) -> Point | None:
    """Every unit with a dynamic form in it, the rest as configured, when that meets the goal
    (one trial; timed under a latency ceiling when it is accurate): no weight goes float. The
    first candidate after all int8 misses, by a fixed rule: a transformer's MatMuls, whose
    static int8 activations lose the outlier channels, keep their int8 weights this way, more
    accurate and faster than the fewest float promotions (docs/guides/verification.md). When every
    weight is then dynamic (or an int8 table), the units without a weight of their own (residual
    Adds, attention MatMuls) go float too: no int8 kernel reads their static Q/DQ pairs any
    more, which only add work (the MiniLM encoder 0.63x -> 0.55x float's latency, cosine up)."""
    if candidates is None or "dynamic" not in candidates:
        return None
    choices: Choices = {u.node: "dynamic" for u in s.units if u.dynamic}
    if not choices:
        return None
    if "float" in candidates and not any(u.weighted and not u.dynamic for u in s.units):
        choices |= {u.node: "float" for u in s.units if not (u.dynamic or u.weighted or u.table or u.half)}
    f = s.trials.fidelity(choices)
    timed = s.goal.max_latency_ratio is not None and s.goal.accurate(f)  # no timing for a miss
    r = s.trials.latency(choices) if timed else None
    ok = s.goal.accurate(f) and s.goal.fast(r)
    s.log(StepKind.ALL_DYNAMIC, "every unit with a dynamic form dynamic", list(choices), choices if ok else {},
          f, r, kept=ok)
    return Point(choices, f, r) if ok else None


def _speed_up(s: SearchState, here: Point) -> Point:
    """A missed latency ceiling: the units measurably faster unquantized (by more than SPEED_TIE
    µs, `Trials.costs`) promoted; if that is not enough, every unit. Each kept unless its
    latency interval lies above the current one's."""
    cheapest = s.cheapest
    slow = {u.node: cheapest[u.node] for u in s.units if s.costs[u.node][1] < -SPEED_TIE}
    everything = {u.node: cheapest[u.node] for u in s.units}
    # All float computes like the float model: under a ceiling of at least 1 it is as fast as needed
    # by construction, whatever a noisy timing says (now misses it anyway); else timings decide.
    ceiling = s.goal.max_latency_ratio
    float_is_fast = ceiling is not None and ceiling >= 1.0
    for action, trial in (("slower in int8: promoted", slow), ("int8 slower overall: all promoted", everything)):
        if here.ratio is None or s.goal.fast(here.ratio) or not trial or trial == here.choices:
            continue
        f, r = s.trials.fidelity(trial), s.trials.latency(trial)
        slower = getattr(r, "low", r) > getattr(here.ratio, "high", here.ratio)  # a tie goes to the promotion
        kept = f is not None and (not slower or (s.all_float(trial) and float_is_fast))
        s.log(StepKind.SPEED, action, [n for n in trial if n not in here.choices], trial if kept else here.choices,
              f, r, kept)
        if kept:
            here = Point(dict(trial), f, r)
    return here


def _accuracy(s: SearchState, here: Point, promote: Promotions, cheaper: dict[str, Choice]) -> Point:
    """The accuracy search: rank the int8 units by measured sensitivity, find the shortest
    prefix of the ranking meeting the goal, then prune, then try each promoted unit in its
    `cheaper` form. Units whose error hides behind a worse one rank low (their gain is measured
    with the worse one still int8), so the prefix may take extra units along; the prune drops
    every one the goal does not need. When units were measured in their dynamic form too, the
    ranking first promotes each to dynamic where that removes most of its error (float is the
    last resort), and only if that misses the goal to float throughout. `balanced` aims at half
    the budget first; out of reach, the best measured candidate (everything promoted). When
    the ranking found that the goal needs most units (`s.missed`), the prefix will be mostly
    float: the caller's better model (`s.instead`, asked about everything promoted) is taken
    before the prefix search when it has one; refused after the noisiest half's guess
    (`s.guessed`), the blocks rank the units as they would have without it, one trial later."""
    ranked, smaller = rank(s, promote, cheaper)
    ranking = replace(promote, ranked=ranked)
    if s.goal.criterion == "accuracy":
        return _most_within_speed(s, ranking, here)
    if s.missed is not None and s.instead is not None:  # the goal needs most units: see `_settle`
        if (mixed := _beside_dynamic(s, ranking, cheaper)) is not None:
            return replace(mixed, ratio=here.ratio)
        everything = ranking.prefix(len(ranked))
        if (better := s.instead(everything, True)) is not None:
            return Point(everything, better, here.ratio)
        if s.guessed:  # refused (about everything: whatever the order): the blocks rank, as without the guess
            s.missed = None
            ranked, smaller = rank(s, promote, cheaper, guess=False)
            ranking = replace(promote, ranked=ranked)
    scales = [0.5, 1.0] if s.goal.criterion == "balanced" and s.goal.max_drop is not None else [1.0]
    rankings = [replace(ranking, to={**promote.to, **smaller}), ranking] if smaller else [ranking]
    for candidate in rankings:
        for scale in scales:
            settled = _settle(s.scaled(scale), candidate, cheaper)
            if settled is not None:
                return replace(settled, ratio=here.ratio)
    everything = ranking.prefix(len(ranking.ranked))
    f = s.trials.fidelity(everything)
    if f is not None and (here.fidelity is None or f.noise < here.fidelity.noise):
        s.log(StepKind.BEST_REACHABLE, "best reachable: all promoted", ranking.ranked, everything, f)
        return Point(everything, f, here.ratio)
    return here


def _shrink(s: SearchState, here: Point) -> Point:
    """int4 weights (`int4` among the candidates): with the goal met, the nodes whose int4
    weights add the least output noise (one quick trial each) go to int4, as many as keep the
    goal (bisection on the quick probe, confirmed on all samples, halving until it holds) and
    the latency ceiling. Smaller files within the same budget. A size budget: qcli.precision.sizebudget."""
    choices = here.choices
    pool = [n for n in s.weighted if n not in choices]
    to: dict[str, Choice] = dict.fromkeys(pool, "int4")
    if not pool or (s.goal.max_bytes is not None and not needs_int4(s, here, {**choices, **to})):
        return here if not pool or s.small(here.choices) else all_int4(s, here, {**choices, **to})
    base = s.trials.fidelity(choices, quick=True)
    found = s.trials.fidelity_many([{**choices, n: "int4"} for n in pool], quick=True)
    added = {n: (f.noise - base.noise) if f is not None and base is not None else float("inf")
             for n, f in zip(pool, found, strict=True)}
    s.log(StepKind.INT4, "int4 weights: noise each adds", [], choices, base, quick=True)
    if s.goal.max_bytes is not None:
        return fit(s, here, added, s.goal.max_bytes)
    int4 = Promotions(choices, to, sorted(pool, key=lambda n: (added[n], s.index[n])))
    lo, hi = 0, len(int4.ranked)
    while lo < hi and not s.trials.exhausted():
        mid = (lo + hi + 1) // 2
        f = s.trials.fidelity(int4.prefix(mid), quick=True)
        ok = s.accurate(f)
        s.log(StepKind.INT4, f"int4 weights on {mid}", int4.ranked[:mid], int4.prefix(mid) if ok else int4.prefix(lo),
              f, kept=ok, quick=True)
        lo, hi = (mid, hi) if ok else (lo, mid - 1)
    k = lo
    while k:
        f = s.trials.fidelity(int4.prefix(k))
        r = s.trials.latency(int4.prefix(k)) if s.goal.max_latency_ratio is not None else None
        ok = s.accurate(f) and s.goal.fast(r)
        s.log(StepKind.INT4, f"confirm int4 weights on {k} on all samples", [], int4.prefix(k) if ok else choices,
              f, r, kept=ok)
        if ok:
            return Point(int4.prefix(k), f, r if r is not None else here.ratio)
        k //= 2
    return here


def _shortest_prefix(s: SearchState, ranking: Promotions, quick: bool = False) -> int | None:
    """Smallest k whose first-k promotion meets the accuracy goal: doubling, then bisection;
    the doubling starts past the prefix `_needs_most` found missing the goal, when it is one."""
    ranked = ranking.ranked
    known = len(s.missed) - len(ranking.fixed) if quick and s.missed is not None else 0
    lo, k = (known, 2 * known) if 0 < known < len(ranked) and ranking.prefix(known) == s.missed else (0, 1)
    while True:
        if s.trials.exhausted():
            return None
        k = min(k, len(ranked))
        if _try_prefix(s, ranking, k, quick):
            break
        if k == len(ranked):
            return None
        lo, k = k, k * 2
    hi = k  # meets the goal; lo does not
    while hi - lo > 1 and not s.trials.exhausted():
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if _try_prefix(s, ranking, mid, quick) else (mid, hi)
    return hi


def _try_prefix(s: SearchState, ranking: Promotions, k: int, quick: bool) -> bool:
    """Whether the first `k` promoted meet the goal (one step)."""
    f = s.trials.fidelity(ranking.prefix(k), quick=quick)
    ok = s.accurate(f)
    s.log(StepKind.PREFIX, f"promote top {k}", ranking.ranked[:k], ranking.prefix(k), f, kept=ok, quick=quick)
    return ok


PRUNE_ONE_BY_ONE = 8  # promoted units up to which the prune tries them one at a time


def _prune(s: SearchState, ranking: Promotions, chosen: Choices, order: list[str], quick: bool = False,
           cheaper: dict[str, Choice] | None = None) -> Choices:
    """Try the promoted units back at int8 (least useful first), or with `cheaper` each in its
    cheaper promotion; keep the changes that still meet the goal.

    More than PRUNE_ONE_BY_ONE units go in chunks: the least useful half first,
    a chunk that cannot go back whole is split in two (both tried, in order), and once a unit
    alone cannot go back, all the units still to try are tried at once first. A ranking that
    missed a unit (its error hidden behind a worse one's: it ranks last, so the prefix takes
    nearly everything along) then costs about 2 log2(n) trials per needed unit instead of n.
    When the goal needs most units (`s.missed`: the sensitivity found it so), the prune ends
    once a unit alone could not go back, then the rest at once, then the rest's least useful
    half: needed units are then dense among the rest, and it would spend a dozen trials on each
    (docs/guides/mixed-precision.md); a unit the ranking missed leaves that half free."""
    pending = [n for n in order if n not in ranking.fixed and n in chosen]
    if cheaper is not None:
        pending = [n for n in pending if cheaper[n] != chosen[n]]
    chunked = len(pending) > PRUNE_ONE_BY_ONE
    if chunked:
        half = len(pending) // 2
        chunks = [pending[:half], pending[half:]]
    else:
        chunks = [[n] for n in pending]
    needs_most = chunked and cheaper is None and s.missed is not None
    rest: list[str] | None = None  # the units still to try after a needed unit, at once
    rest_missed = False
    while chunks and not s.trials.exhausted():
        chunk = chunks.pop(0)
        trial = ({k: v for k, v in chosen.items() if k not in chunk} if cheaper is None
                 else {**chosen, **{n: cheaper[n] for n in chunk}})
        f = s.trials.fidelity(trial, quick=quick, stop_below=None if quick else s.goal.stop_below)
        ok = s.accurate(f)
        if cheaper is None:
            s.log(StepKind.PRUNE, s.back(chunk), chunk, trial if ok else chosen, f, kept=ok, quick=quick)
        else:
            s.log(StepKind.CHEAPER, f"to {cheaper[chunk[0]]} (cheaper)", chunk, trial if ok else chosen, f, kept=ok,
                  quick=quick)
        if ok:
            chosen, rest_missed = trial, False
        elif needs_most and rest_missed:  # the rest's least useful half is needed too
            break
        elif len(chunk) > 1:
            rest_missed = needs_most and chunk is rest
            half = len(chunk) // 2
            chunks[:0] = [chunk[:half], chunk[half:]]
        elif chunked and len(chunks) > 1:  # a needed unit found: the rest, at once first
            rest = [n for c in chunks for n in c]
            chunks = [rest]
    return chosen


def _settle(s: SearchState, ranking: Promotions, cheaper: dict[str, Choice] | None = None) -> Point | None:
    """The accuracy search: the shortest prefix, the prune and (with `cheaper`) each promoted
    unit tried in its cheaper promotion, on the quick probe (a few samples: cheap), each result
    confirmed on all samples (a few samples can flatter a candidate: the prefix then doubles
    until it holds; a prune that does not hold is redone on all samples over the units it
    changed: the ones the quick probe found needed stay promoted; a confirmation stops once it
    must miss the agreement floor, `Trials.fidelity`'s `stop_below`). A prefix the caller has
    better than (`s.instead`: the rescue's weight-only model, for a prefix mostly float, as
    any that holds from there on is; asked before the prefix is confirmed, which it would
    replace, and again once it is) is the result, unpruned, with the caller's model's
    fidelity."""
    k = _shortest_prefix(s, ranking, quick=True)
    if k is None:
        return None
    while True:
        if s.instead is not None and (better := s.instead(ranking.prefix(k), False)) is not None:
            return Point(ranking.prefix(k), better)
        f = s.trials.fidelity(ranking.prefix(k), stop_below=s.goal.stop_below)  # a miss: in part
        ok = s.accurate(f)
        s.log(StepKind.CONFIRM, f"confirm top {k} on all samples", [], ranking.prefix(k), f, kept=ok)
        if ok:
            break
        if k >= len(ranking.ranked) or s.trials.exhausted():
            return None
        k = min(2 * k, len(ranking.ranked))
    chosen = ranking.prefix(k)
    if s.instead is not None and (better := s.instead(chosen, True)) is not None:
        return Point(chosen, better)
    chosen = _pruned(s, ranking, chosen, ranking.ranked[:k][::-1], cheaper)
    return Point(chosen, s.trials.fidelity(chosen))


def _pruned(s: SearchState, ranking: Promotions, chosen: Choices, order: list[str],
            cheaper: dict[str, Choice] | None = None, quick: bool = True) -> Choices:
    """`chosen` pruned (its units in `order`, least useful first), then with `cheaper` each
    promoted unit tried in its cheaper promotion: each on the quick probe, confirmed on all
    samples, redone on all samples over the units it changed when that misses (`_settle`);
    without `quick`, on all samples from the start."""
    for what, change in [("the prune", None)] + ([("the cheaper promotions", cheaper)] if cheaper else []):
        todo = [n for n in order if n in chosen]
        changed = _prune(s, ranking, chosen, todo, quick=quick, cheaper=change)
        if changed != chosen and quick:
            f = s.trials.fidelity(changed, stop_below=s.goal.stop_below)
            ok = s.accurate(f)
            s.log(StepKind.CONFIRM, f"confirm {what} on all samples", [], changed if ok else chosen, f, kept=ok)
            redo = [n for n in todo if changed.get(n) != chosen.get(n)]  # what the quick prune changed
            changed = changed if ok else _prune(s, ranking, chosen, redo, cheaper=change)
        chosen = changed
    return chosen


def _beside_dynamic(s: SearchState, ranking: Promotions, cheaper: dict[str, Choice]) -> Point | None:
    """When the goal needs most units (`s.missed`, the promoted half that missed it), that half
    with every other unit that has a dynamic form dynamic (one trial on all samples), pruned
    (least sensitive first) when it meets the goal; None when it misses or no other unit has a
    dynamic form. The dynamic forms were judged together against all int8 (`_all_dynamic`),
    where a worse unit's error can hide their gain (DNSMOS's STFT convolutions:
    docs/guides/mixed-precision.md). Pruned on all samples: the quick probe's few samples
    cannot show a regression's ceiling (DNSMOS kept two more convolutions float). The caller's
    model (`s.instead`) is asked about the pruned one, as about a settled prefix."""
    missed = s.missed
    assert missed is not None
    half = [n for n in ranking.ranked if missed.get(n) != ranking.fixed.get(n)]
    dynamic = {n: c for n, c in cheaper.items() if c == "dynamic" and n not in half and n not in ranking.fixed}
    if not dynamic:
        return None
    chosen = {**dynamic, **missed}
    f = s.trials.fidelity(chosen, stop_below=s.goal.stop_below)
    ok = s.accurate(f)
    s.log(StepKind.CONFIRM, "the half that missed, every other unit with a dynamic form dynamic, on all samples",
          list(dynamic), chosen if ok else ranking.fixed, f, kept=ok)  # missed: nothing held
    if not ok:
        return None
    chosen = _pruned(s, ranking, chosen, half[::-1], quick=False)
    if s.instead is not None and (better := s.instead(chosen, True)) is not None:
        return Point(chosen, better)
    return Point(chosen, s.trials.fidelity(chosen))


def _most_within_speed(s: SearchState, ranking: Promotions, here: Point) -> Point:
    """`accuracy` criterion: the longest prefix of the ranking whose latency stays within the
    speed floor (bisection on measured latency)."""
    lo, hi = 0, len(ranking.ranked)
    best = here
    while lo < hi and not s.trials.exhausted():
        mid = (lo + hi + 1) // 2
        candidate = ranking.prefix(mid)
        r = s.trials.latency(candidate)
        f = s.trials.fidelity(candidate)
        ok = s.goal.fast(r) and f is not None
        s.log(StepKind.PREFIX, f"promote top {mid}", ranking.ranked[:mid], candidate, f, r, kept=ok)
        if ok:
            lo, best = mid, Point(candidate, f, r)
        else:
            hi = mid - 1
    return best
