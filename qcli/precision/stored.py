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
that it is about to confirm mostly float, or against everything promoted as soon as the ranking finds
that the goal needs most units, and stops the search there when it holds (qcli.verify). Its
trials are its own, not counted in the search's. Only in onnxruntime's CPU scheme (uint8
asymmetric activations, 8-bit weights, as for the rescue's dynamic forms): a TensorRT config
(int8 symmetric) asks for int8 kernels.

When the whole model weight-only misses the goal, some weights matter more than others (the
first convolutions of a CNN, whose rounding the network amplifies). The rest's weights are
wider: 16-bit (half the float bytes, rounding 256x finer than int8's) when the model 16-bit
throughout meets the goal (one trial on all samples), else float. The units whose weights stay
int8 are found greedily, largest first (the largest units holding POOL_SHARE of the bytes: the
small rest keeps wider weights), on all samples (`_greedy`; PARTIAL_TRIALS at most): rounds
that add 1, 2, 4, ... units beside those already held until one misses, then bisect, each
sending the first unit that misses to the back. No trial per unit, and the quick probe only
screens a unit alone: its few samples flatter (PP-LCNet: 13 units held on 8 samples, 10 on
32), so what misses there misses; a trial on all samples stops once it must miss the floor
(`Trials.fidelity`'s `stop_below`: only verdicts are read here). They are written instead, on the same terms;
beside 16-bit weights, only when they save a quarter of the 16-bit model's bytes (`_partial`),
else the model is 16-bit throughout. The units are the weight-only plan's: recurrent cells
(LSTM, GRU, RNN) store their weights there too (rules.WEIGHT_ONLY).

With `weights.algorithm: gptq` (or `awq`) the weights come from the calibration samples, so
the weight-only candidates are built per fold like any other (`_own_trials`), each fold's
model rounded on the other folds' Gram matrices. The rescue does not switch to GPTQ on its own
(docs/guides/verification.md: measured on the exported models, its int8 weights held where
rounding to nearest needed 16 bits on magika alone, for 4-15 s more on the others).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace

from qcli.analyze.fidelity import Fidelity
from qcli.analyze.size import weight_bytes
from qcli.config import Activations, Config
from qcli.info import element_count, tensor_bytes
from qcli.phases import phase
from qcli.plan import make_plan
from qcli.precision.goal import Goal
from qcli.precision.trials import Trials
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
        # against a rescue's model that computes in float too, as fast by construction when
        # every weight folds at load: untimed
        timed = goal.max_latency_ratio is not None and (current.plan.quantizes or not folds_at_load(result))
        ratio: float | None = trials.probe.latency_ratio(result.model) if timed else None
        if timed and not current.plan.quantizes and not goal.fast(ratio):
            tabled = _tables_float(wo, trials, choices)
            if tabled is None:  # slower, and no table to blame
                return None
            choices, result, ratio = tabled
            after = weight_bytes(result.model)[0]
            if after > SAVES * now:
                return None
        f = wo.fidelity(choices)
        if f is None or not goal.accurate(f):
            return None
    weighted = sum(u.weighted for u in wo.units)
    rounding = "GPTQ" if wo.config.weights.algorithm == "gptq" else " + ".join(wo.config.recovery.rounding)
    widths = _widths(choices, weighted) + (  # int8 units' weights; 16-bit ones round to nearest (qcli.gptq)
        f" rounded by {rounding}" if rounding and len(choices) < weighted else "")
    note = (f"weight-only: the rescue's model kept most weights float ({now / float_bytes:.2f} of the float "
            f"model's weight bytes); the model with {widths} and float activations (computed in float, its "
            f"weights folded at load) meets the floors in {after / float_bytes:.2f} of them and is written instead")
    slower = ratio is not None and current_ratio is not None and getattr(ratio, "low", ratio) > getattr(
        current_ratio, "high", current_ratio)
    return Stored(result, promoted_config(stored, choices, wo.units), f, ratio, note) if goal.fast(
        ratio) and not slower else None


def folds_at_load(result: QuantizeResult) -> bool:
    """Whether every integer weight of a weight-only model is a Cast and Mul of constants, which
    onnxruntime folds when it loads the model (it then computes as the float model does). An
    int8 table read by Gather is not: its DequantizeLinear runs on every call, and onnxruntime
    may move it past a Transpose by quantizing again there (arabic-name-romanizer's encoder:
    1.25x its float latency, its GRU weights folded)."""
    return not any(n.op_type in ("DequantizeLinear", "QuantizeLinear") for n in result.model.graph.node)


def _tables_float(wo: Trials, trials: Trials, choices: Choices) -> tuple[Choices, QuantizeResult, float | None] | None:
    """The weight-only model with its Gather tables float, when it missed the latency floor
    (`folds_at_load`): its other weights still fold at load. None: it has no table."""
    ops = {n.name: n.op_type for n in trials.prepared.model.graph.node}
    tables: dict[str, Choice] = {u.node: "float" for u in wo.units if ops.get(u.node) == "Gather"}
    if not tables:
        return None
    choices = {**choices, **tables}
    result = wo.build(choices)
    return choices, result, None if folds_at_load(result) else trials.probe.latency_ratio(result.model)


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


PARTIAL_TRIALS = 16  # the partial search's trials after the whole model's two


def _own_trials(trials: Trials, stored: Config) -> Trials:
    """`trials` for the weight-only config `stored`: their own units (its plan's: recurrent
    cells store weights there, rules.WEIGHT_ONLY, as a worker finds them), caches (empty after
    `replace`) and budget (the whole model in 8 and in 16 bits, then PARTIAL_TRIALS), no folds
    (float activations need no ranges: one model serves every fold) unless the weights are
    rounded from the calibration samples (GPTQ, AWQ: each fold's model on its own)."""
    units = find_units(trials.prepared.model, make_plan(trials.prepared.model, stored))
    folds = trials.table.folds if stored.weights.from_data or stored.recovery.rounds else []
    return replace(trials, config=stored, units=units, table=replace(trials.table, folds=folds), count=0,
                   max_trials=2 + PARTIAL_TRIALS, stopped=None)


POOL_SHARE = 0.95  # the partial search weighs the largest units that hold this share of the bytes


def _largest(sizes: dict[str, int], position: dict[str, int]) -> list[str]:
    """The largest units (by weight bytes; in graph order among equals) that together hold
    POOL_SHARE of them, largest first: the small rest saves little and would stretch the
    bisection.

    >>> _largest({"a": 10, "b": 900, "c": 90}, {"a": 0, "b": 1, "c": 2})
    ['b', 'c']
    """
    total, pool, held = sum(sizes.values()), [], 0
    for name in sorted(sizes, key=lambda n: (-sizes[n], position[n])):
        if held >= POOL_SHARE * total:
            break
        pool.append(name)
        held += sizes[name]
    return pool


def _partial(wo: Trials, goal: Goal, needed: float) -> Choices | None:
    """The units whose weights are not int8 (choices `int16`, or `float` when even 16-bit
    weights throughout miss the goal) for the most int8 weights meeting the goal (module
    docstring): none when the whole model does; None when nothing does, or what does saves
    fewer than `needed` bytes of the float weights (not confirmed). Beside 16-bit weights,
    int8 units are kept only when they cut the 16-bit model's unit bytes to SAVES of them
    (each int8 unit risks a decision on unseen data; tashkeel's few int8 units saved 1% and
    changed 3 of 256 held-out sequences): else the model is 16-bit throughout."""
    floor = goal.stop_below  # a trial stops once it must miss this (`Trials.fidelity`)
    if goal.accurate(wo.fidelity({}, stop_below=floor)):
        return {}
    sizes = {t.name: tensor_bytes(t.data_type, element_count(t.dims)) for t in wo.prepared.model.graph.initializer}
    weighted = {u.node: sum(sizes.get(t, 0) for t in u.tensors) for u in wo.units if u.weighted}
    int16 = wo.fidelity(dict.fromkeys(weighted, "int16"), stop_below=floor)
    wide: Choice = "int16" if goal.accurate(int16) else "float"
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

    order = _largest(weighted, {u.node: k for k, u in enumerate(wo.units)})
    small = [n for n in weighted if n not in order]
    fallback = rest_wide(0) if wide == "int16" and saves(0) else None
    k = _greedy(wo, goal, rest_wide, saves, order)
    best = rest_wide(k) if k and saves(k) else None
    return fallback if best is None else best  # 16-bit weights throughout held above


def _greedy(wo: Trials, goal: Goal, rest_wide: Callable[[int], Choices], saves: Callable[[int], bool],
            order: list[str]) -> int:
    """The most units of `order` int8 (largest first) that hold together on all samples,
    PARTIAL_TRIALS at most: `order` reordered in place so that its first k units (returned)
    are those. Each round adds 1, 2, 4, ... units after those held until a miss, then bisects
    (in the first round the whole pool is taken to miss, as the whole model did), and sends
    the first unit that misses beside those held to the back. A unit alone beside them is
    screened on the quick probe first: its few samples flatter, so what misses there misses.
    Rounds end after two in a row keep none (nakdimon misses with any unit int8: the rest
    would cost a trial each), or once the units held and untried together could not save
    enough (`saves`)."""
    k, end, missed = 0, len(order), 0

    def holds(j: int) -> bool:
        if j == k + 1 and not goal.accurate(wo.fidelity(rest_wide(j), quick=True)):
            return False
        return goal.accurate(wo.fidelity(rest_wide(j), stop_below=goal.stop_below))

    while k < end and missed < 2 and saves(end) and not wo.exhausted():
        lo, hi, step = 0, end - k - (1 if end == len(order) else 0), 1
        while lo < hi and not wo.exhausted():
            mid = min(step, hi) if step else (lo + hi + 1) // 2
            if holds(k + mid):
                lo, step = mid, 2 * step
            else:
                hi, step = mid - 1, 0
        if lo < hi:  # out of trials mid-round: what held stands
            return k + lo
        k, missed = k + lo, 0 if lo else missed + 1
        if k < end:
            order.append(order.pop(k))
            end -= 1
    return k
