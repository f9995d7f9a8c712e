"""The rescue's step before float: the model weight-only (8- or 16-bit weights, float activations).

When the rescue's model keeps less than half of the float model's weight bytes in integers
(it went mostly float), the model quantized weight-only (`activations: {dtype: float}`: its
8-bit weights written as Cast, Mul, which onnxruntime folds at load, qcli/qdq.py) computes in
float at float's speed from a file about 4x smaller. It needs no calibration, so every
compared sample is unseen by it, whatever the folds. It replaces the rescue's model when it
meets the same goal (the floors by the verdict rule, the latency ceiling), is not measurably
slower than it (untimed when it computes in float too: as fast by construction, its weights
folded at load), and its weights take at most 3/4 of its bytes (none are measured when even
every weight int8 would not). The rescue tries it at the first prefix of the search's ranking
that it confirms mostly float, or against everything promoted as soon as the ranking finds
that the goal needs most units, and stops the search there when it holds (qcli.verify). Its
trials are its own, not counted in the search's. Only in onnxruntime's CPU scheme (uint8
asymmetric activations, 8-bit weights, as for the rescue's dynamic forms): a TensorRT config
(int8 symmetric) asks for int8 kernels.

When the whole model weight-only misses the goal, some weights matter more than others (the
first convolutions of a CNN, whose rounding the network amplifies). The rest's weights are
wider: 16-bit (half the float bytes, rounding 256x finer than int8's) when the model 16-bit
throughout meets the goal (one trial on all samples), else float. Each weighted unit
weight-only alone is measured on the quick probe (one trial each; the largest units holding
POOL_SHARE of the bytes: the rest keep wider weights), and the most units (least predicted
loss, then output noise, per weight byte first: `_loss`) whose weights stay int8 while the rest
keep wider ones and the goal is met (bisection on the quick probe, confirmed on all samples:
halving until one holds, then bisecting back up towards the smallest that missed;
PARTIAL_TRIALS more at most) are written instead, on the same terms; beside 16-bit weights,
only when they save a quarter of the 16-bit model's bytes (`_partial`), else the model is
16-bit throughout. The units are the weight-only plan's: recurrent cells (LSTM, GRU, RNN)
store their weights there too (rules.WEIGHT_ONLY).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from qcli.analyze.probe import Fidelity
from qcli.analyze.size import weight_bytes
from qcli.config import Activations, Config
from qcli.info import tensor_bytes
from qcli.phases import phase
from qcli.plan import make_plan
from qcli.precision.goal import Goal
from qcli.precision.trials import Alone, Trials
from qcli.precision.units import Choice, Choices, find_units, promoted_config
from qcli.quantize import QuantizeResult


@dataclass(frozen=True)
class Stored:
    result: QuantizeResult
    config: Config  # reproduces it: the input config with float activations, search off
    fidelity: Fidelity
    ratio: float | None
    note: str  # what it replaced, in words


#: the weight-only model must take at most this share of the rescue's model's weight bytes
SAVES = 0.75


def mostly_float(trials: Trials, current: QuantizeResult) -> bool:
    """Whether the weight-only step applies to the rescue's `current`: a config of 8-bit
    weights and quantized activations, and less than half of the float model's weight bytes
    in integers."""
    config = trials.config
    if config.activations.dtype == "float" or config.weights.dtype not in ("int8", "uint8"):
        return False
    float_bytes = weight_bytes(trials.prepared.model)[0]  # every graph
    return bool(float_bytes) and 2 * weight_bytes(current.model)[0] >= float_bytes


def weight_only(trials: Trials, goal: Goal, current: QuantizeResult, current_ratio: float | None) -> Stored | None:
    """The weight-only model when the rescue's `current` (latency ratio `current_ratio`, None:
    not compared) is mostly float and it does better: at most SAVES of its weight bytes, the
    goal met, not measurably slower than `current` (module docstring); else None."""
    if not mostly_float(trials, current):
        return None
    config = trials.config
    float_bytes, now = weight_bytes(trials.prepared.model)[0], weight_bytes(current.model)[0]
    stored = config.model_copy(update={
        "activations": Activations(dtype="float", symmetric=config.activations.symmetric),
        "auto_precision": config.auto_precision.model_copy(update={"enabled": False}),
    })
    wo = _own_trials(trials, stored)
    with phase("weight-only"):
        if weight_bytes(wo.build({}).model)[0] > SAVES * now:  # even every weight int8 would not save enough
            return None
        choices = _partial(wo, goal, float_bytes - SAVES * now)
        if choices is None:
            return None
        result = wo.build(choices)
        after = weight_bytes(result.model)[0]
        if after > SAVES * now:
            return None
        f = wo.fidelity(choices)
        assert f is not None  # measured by `_partial`
        # against a rescue's model that computes in float too, as fast by construction: untimed
        timed = goal.max_latency_ratio is not None and current.plan.quantizes
        ratio = trials.probe.latency_ratio(result.model) if timed else None
    widths = _widths(choices, sum(u.weighted for u in wo.units))
    note = (f"weight-only: the rescue's model kept most weights float ({now / float_bytes:.2f} of the float "
            f"model's weight bytes); the model with {widths} and float activations (computed in float, its "
            f"weights folded at load) meets the floors in {after / float_bytes:.2f} of them and is written instead")
    slower = ratio is not None and current_ratio is not None and getattr(ratio, "low", ratio) > getattr(
        current_ratio, "high", current_ratio)
    return Stored(result, promoted_config(stored, choices, wo.units), f, ratio, note) if goal.fast(
        ratio) and not slower else None


def _widths(choices: Choices, units: int) -> str:
    """The weights' types in words.

    >>> _widths({}, 3), _widths({"a": "int16", "b": "float"}, 3), _widths({"a": "int16"}, 1)
    ('int8 weights', 'int8 weights (1 unit with int16 weights, 1 with float weights)', 'int16 weights')
    """
    wider = sorted(Counter(choices.values()).items(), key=lambda kv: kv[0] != "int16")
    if len(choices) == units and len(wider) == 1:
        return f"{wider[0][0]} weights"
    if not choices:
        return "int8 weights"
    first, rest = wider[0], wider[1:]
    said = [f"{first[1]} unit{'s' if first[1] > 1 else ''} with {first[0]} weights"]
    return f"int8 weights ({', '.join(said + [f'{n} with {p} weights' for p, n in rest])})"


PARTIAL_TRIALS = 16  # the partial search's trials after one per weighted unit


def _own_trials(trials: Trials, stored: Config) -> Trials:
    """`trials` for the weight-only config `stored`: their own units (its plan's: recurrent
    cells store weights there, rules.WEIGHT_ONLY, as a worker finds them), caches (empty after
    `replace`) and budget (one trial per weighted unit, then PARTIAL_TRIALS), no folds (float
    activations need no ranges: one model serves every fold)."""
    units = find_units(trials.prepared.model, make_plan(trials.prepared.model, stored))
    weighted = sum(u.weighted for u in units)
    return replace(trials, config=stored, units=units, table=replace(trials.table, folds=[]), count=0,
                   max_trials=2 + weighted + PARTIAL_TRIALS, stopped=None)


POOL_SHARE = 0.95  # the partial search weighs the largest units that hold this share of the bytes


def _largest(sizes: dict[str, int]) -> list[str]:
    """The largest units (by weight bytes) that together hold POOL_SHARE of them: the small
    rest saves little and would cost a trial each.

    >>> _largest({"a": 10, "b": 900, "c": 90})
    ['b', 'c']
    """
    total, pool, held = sum(sizes.values()), [], 0
    for name in sorted(sizes, key=lambda n: -sizes[n]):
        if held >= POOL_SHARE * total:
            break
        pool.append(name)
        held += sizes[name]
    return pool


def _loss(f: Fidelity | None) -> float:
    """The largest loss a candidate is predicted to have on unseen samples: 1 - the predicted
    agreement of decisions (top-1, sequence), 1 - the agreement or cosine of other outputs. The
    margins' prediction follows what the floors judge, where the output noise of a softmax can
    stay small while decisions flip (ddddocr's recognizer)."""
    if f is None:
        return float("inf")
    losses = [1.0 - (o.predicted_agreement if o.predicted_agreement is not None else v)
              for o in f.outputs for v in (o.gated_agreement, o.gated_cosine) if v is not None]
    return max(losses, default=0.0)


def _partial(wo: Trials, goal: Goal, needed: float) -> Choices | None:
    """The units whose weights are not int8 (choices `int16`, or `float` when even 16-bit
    weights throughout miss the goal) for the most int8 weights meeting the goal (module
    docstring): none when the whole model does; None when nothing does, or what does saves
    fewer than `needed` bytes of the float weights (not confirmed). Beside 16-bit weights,
    int8 units are kept only when they cut the 16-bit model's unit bytes to SAVES of them
    (each int8 unit risks a decision on unseen data; tashkeel's few int8 units saved 1% and
    changed 3 of 256 held-out sequences): else the model is 16-bit throughout."""
    if goal.accurate(wo.fidelity({})):
        return {}
    sizes = {t.name: tensor_bytes(t.data_type, int(np.prod(t.dims))) for t in wo.prepared.model.graph.initializer}
    weighted = {u.node: sum(sizes.get(t, 0) for t in u.tensors) for u in wo.units if u.weighted}
    wide: Choice = "int16" if goal.accurate(wo.fidelity(dict.fromkeys(weighted, "int16"))) else "float"
    kept = 0.5 if wide == "int16" else 0.0  # the share of a unit's float bytes its wider weights save

    def rest_wide(k: int) -> Choices:
        return dict.fromkeys(order[k:] + small, wide)

    def saves(k: int) -> bool:
        """Whether k int8 units save `needed` bytes, and, beside 16-bit weights, enough that
        their risk pays: the model at most SAVES of the 16-bit one's unit bytes."""
        narrow, total = sum(weighted[n] for n in order[:k]), sum(weighted.values())
        wide_bytes = (1 - kept) * total
        worth = wide == "float" or k == 0 or wide_bytes - (0.75 - kept) * narrow <= SAVES * wide_bytes
        return worth and 0.75 * narrow + kept * (total - narrow) >= needed

    pool = _largest(weighted)
    order, small = list(pool), [n for n in weighted if n not in pool]
    fallback = rest_wide(0) if wide == "int16" and saves(0) else None
    # beside 16-bit weights a worthy int8 set holds at least `least` bytes: once the units
    # missing alone leave less than that, no set is (largest first: they decide soonest)
    least = (1 - SAVES) * (1 - kept) * sum(weighted.values()) / (0.75 - kept) if wide == "int16" else 0.0
    found = _alone(wo, goal, pool, weighted, least)
    if found is None:
        return fallback
    position = {u.node: k for k, u in enumerate(wo.units)}

    def per_byte(n: str, f: Fidelity | None) -> tuple[float, float, int]:
        size = max(weighted[n], 1)
        return _loss(f) / size, (f.noise if f is not None else float("inf")) / size, position[n]

    keys = {n: per_byte(n, f) for n, f in zip(pool, found, strict=True)}
    order[:] = sorted(keys, key=keys.__getitem__)  # the least loss for the bytes it saves first

    # all of them int8 missed already; when each alone misses too, none can join another; the
    # least that saves enough holds on the quick probe, or no more does either
    worthy = next((k for k in range(1, len(order)) if saves(k)), len(order))
    lo, hi = 0, len(order) - 1 if any(goal.accurate(f) for f in found) else 0
    if worthy > 1 and worthy <= hi:
        lo, hi = (worthy, hi) if goal.accurate(wo.fidelity(rest_wide(worthy), quick=True)) else (0, 0)
    elif worthy > hi:
        hi = 0
    while lo < hi and not wo.exhausted():
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if goal.accurate(wo.fidelity(rest_wide(mid), quick=True)) else (lo, mid - 1)
    best = _confirm(wo, goal, lo, saves, rest_wide)
    return fallback if best is None else best  # 16-bit weights throughout held above


def _alone(wo: Trials, goal: Goal, pool: list[str], weighted: dict[str, int], least: float
           ) -> list[Fidelity | None] | None:
    """Each unit of `pool` int8 alone, on the quick probe; None as soon as the units that meet
    the goal alone, with those not measured yet, hold fewer than `least` bytes (a unit that
    misses alone joins no set that holds: the search's monotone premise)."""
    if not least:
        return wo.fidelity_many([Alone(n) for n in pool], quick=True)
    found: list[Fidelity | None] = []
    left = sum(weighted[n] for n in pool)
    if left < least:
        return None
    for n in pool:
        found.append(wo.fidelity(Alone(n), quick=True))
        left -= 0 if goal.accurate(found[-1]) else weighted[n]
        if left < least:
            return None
    return found


def _confirm(wo: Trials, goal: Goal, k: int, saves: Callable[[int], bool],
             rest_wide: Callable[[int], Choices]) -> Choices | None:
    """The most int8 units, at most `k` (the quick probe's answer, which can flatter), that
    meet the goal on all samples while they save enough (`saves`): `k`, then halving until one
    holds, then bisection between it and the smallest that missed."""
    best, lo, hi, j = None, 0, k, k
    while j > lo and saves(j) and not wo.exhausted():
        if goal.accurate(wo.fidelity(rest_wide(j))):
            best, lo = rest_wide(j), j
            if j == hi:
                break
        else:
            hi = j - 1
        j = (lo + hi + 1) // 2 if best is not None else j // 2
    return best
