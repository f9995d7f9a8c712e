"""Safe by default: quantize, compare with the float model, rescue what misses a floor.

`quantize_checked` is what `qcli quantize` and `qcli run` do (docs/guides/verification.md):
1. prepare the model once; calibrate on `--data` (or take the calibration file);
2. quantize with the config;
3. auto-precision (`auto_precision.enabled`): search for the choices meeting the config's
   criterion and the verification floors (qcli.precision);
   otherwise verification (`verify.enabled`): compare with the float model on held-back samples;
   when a floor is missed and `verify.rescue` is on, the same search with criterion
   `performance` and the floors as its goal, within `verify.max_trials` (a count: the time
   budget is reported, never a stop);
4. return the model and everything measured; the caller writes the model (and, when units were
   promoted, the precision config that reproduces it) and exits 1 when a floor is still missed.

Which samples are compared: qcli.holdout (decided once, stated in the summary).
Latency is the target profile's prediction for the user's model file as given and each
candidate, at `target.batch` (qcli.target, docs/guides/targets.md): exact, so every decision is the
same on any machine and under any load; the floor is widened by PREDICTION_TOLERANCE, and this
machine's A/B timing of the model written is reported beside it, never deciding. With
`verify.latency: measured` the ratio is timed instead: a `latency.Ratio` (median of per-round
ratios, with its interval), the floor widened by LATENCY_TOLERANCE and missed only when the
whole interval is above it. The latency floor applies when the float model takes at least
`verify.min_float_ms` per run (predicted; measured: its fastest run at batch 1): below that,
onnxruntime's fixed cost per node, not arithmetic, decides the ratio. What the verification
reports, check by check: qcli.checks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import onnx

from qcli import gptq
from qcli.analyze.fidelity import Fidelity
from qcli.analyze.kinds import check_outputs
from qcli.analyze.plugin import load_metric
from qcli.analyze.predicted import served
from qcli.analyze.probe import Probe
from qcli.analyze.size import weight_bytes
from qcli.calibrate.ranges import RangeSettings
from qcli.calibrate.table import CalibrationTable
from qcli.checks import (
    LATENCY_TOLERANCE,
    Verification,
    fast_by_construction,
    latency_ok,
    memory_check,
    tolerant,
    verification_of,
)
from qcli.config import Config
from qcli.data import InputSpec, model_inputs
from qcli.errors import InternalError, QcliError
from qcli.holdout import DataPlan, calibrate_planned, deployment_feeds, make_probe, plan_samples
from qcli.model import Owned, fingerprint
from qcli.phases import ProgressFactory, no_progress, phase
from qcli.plan import make_plan
from qcli.precision import (
    Choices,
    Costs,
    Goal,
    SearchResult,
    Trials,
    find_units,
    goal_of,
    promoted_config,
    search,
)
from qcli.precision.reasons import Why, in_plan, reasons, whys
from qcli.precision.stored import SAVES, Stored, mostly_float, weight_only
from qcli.preparation import kept_passes
from qcli.prepare import PrepareResult
from qcli.quantize import (
    QuantizeResult,
    check_unmatched,
    prepare_for,
    quantize,
)
from qcli.recovery.bias import needs_data as bias_needs_data
from qcli.runtime import Loan
from qcli.target.deployment import Deployment

QUICK_SAMPLES = 16  # samples the search ranks units on, at most (floors are checked on all of them)

@dataclass
class Outcome:
    result: QuantizeResult
    config: Config  # reproduces the model: the input config plus the promotions as overrides
    table: CalibrationTable  # its fold tables (k-fold verification) dropped once a search ran
    data: DataPlan
    verification: Verification | None = None
    search: SearchResult | None = None
    promoted: Choices = field(default_factory=dict)  # node -> int16 | float | int4
    reasons: dict[str, str] = field(default_factory=dict)  # node -> why it was promoted
    goal_met: bool = True
    searched_for_goal: bool = False  # auto-precision ran (its goal, not only the floors)
    weight_only: bool = False  # the rescue wrote the whole model weight-only (qcli.precision.stored)
    notes: list[str] = field(default_factory=list)


def quantize_checked(
    model: onnx.ModelProto | Owned,
    config: Config,
    *,
    data: Path | None = None,
    table: CalibrationTable | None = None,
    eval_data: Path | None = None,
    labels: Path | None = None,
    force: bool = False,
    strict: bool = False,
    progress: ProgressFactory = no_progress,
    methods: tuple[str, ...] | None = None,
    executor=None,
) -> Outcome:
    """Calibrate (when `data` is given), quantize, verify and rescue; see the module docstring.
    `methods`: the range methods the calibration solves (default: only the config's);
    `executor`: where the calibration pass and the search's independent trials run
    (qcli.executor; default this process). `model` handed over (`Owned`, as the CLI does): the
    float weights the prepared model holds byte for byte are held once through the
    verification (`qcli.runtime.Loan`), not twice."""
    owned = isinstance(model, Owned)
    model = model.take() if isinstance(model, Owned) else model
    if data is not None and table is not None:
        raise ValueError("give at most one of data or table")
    if config.recovery.bias_correction is not None and data is None:
        raise bias_needs_data()
    if config.recovery.rounds and data is None:
        raise gptq.needs_data(config.recovery.rounding[0])
    ap, vf = config.auto_precision, config.verify
    check_outputs(model, vf.outputs)
    kept: list[str] = []  # notes on the target and the preparation
    if vf.enabled or ap.enabled:  # a target profile that cannot be had: refused before the work
        kept += [said] if (said := Deployment.of(config).elsewhere(model)) else []
    if vf.metric and (vf.enabled or ap.enabled):
        load_metric(vf.metric)  # an import error before the work, not after calibration
    inputs = model_inputs(model)
    plan = plan_samples(data, eval_data, config, inputs)
    with phase("prepare"):
        prepared = prepare_for(model, config, force=force)
        predicted = None  # the float model's prediction, its feeds and their prompt, for the probe to take over
        if table is None and plan.verify_path is not None and _floor_predicted(config):
            deployment, prompt = Deployment.of(config), deployment_feeds(model, plan, inputs, config)
            with phase("predict"):
                feeds = served(model, prompt)
                predicted = (prompt, feeds, deployment.predict(model, feeds))
            prepared, config, left = kept_passes(model, config, prepared, feeds, deployment, predicted[2], force=force)
            kept += left
    if data is None and table is None:  # a config that calibrates nothing (dynamic, weight-only)
        table, why = _no_calibration(model, prepared, config, strict)
        plan = replace(plan, description=why) if plan.verify_path is None else plan
    if table is None:
        assert data is not None  # one of the two
        with phase("calibrate"):
            plan, table = calibrate_planned(model, config, data, plan, prepared, progress=progress,
                                            executor=executor, methods=methods, force=force, strict=strict)
    with phase("build"):
        result = quantize(model, config, table, force=force, strict=strict, prepared=prepared)
    outcome = Outcome(result, config, table, plan, searched_for_goal=ap.enabled, notes=kept)
    if not (ap.enabled or vf.enabled):
        return outcome
    if plan.verify_path is None:
        outcome.notes.append(f"verification skipped: {plan.description}")
        if ap.enabled:
            raise QcliError("auto-precision needs data to measure on", hint="give --eval-data DIR (or --data DIR)")
        return outcome
    labels = labels if eval_data is not None else None
    if not owned:
        return _verified(outcome, model, prepared, inputs, labels, executor, force, progress, predicted)
    with Loan(model, prepared.model) as model:  # the caller's copy of the weights is freed here
        return _verified(outcome, model, prepared, inputs, labels, executor, force, progress, predicted)


def _verified(outcome: Outcome, model: onnx.ModelProto, prepared: PrepareResult, inputs: list[InputSpec],
              labels: Path | None, executor, force: bool, progress: ProgressFactory, predicted=None) -> Outcome:
    """`outcome` verified against the float `model` on the plan's samples, and rescued;
    `predicted`: (feeds, the float model's prediction on them), made while preparing."""
    config, table, plan, result = outcome.config, outcome.table, outcome.data, outcome.result
    ap, vf = config.auto_precision, config.verify
    with phase("reference"):  # the float model's outputs
        probe = make_probe(model, inputs, config, plan, labels)
        if predicted is not None:
            probe.take_prediction(*predicted)
    units = find_units(result.planned or prepared.model, result.plan)
    budget = (ap.max_trials, ap.time_budget) if ap.enabled else (vf.max_trials, vf.time_budget)
    with phase("verify"), progress("verifying" if not ap.enabled else "searching precisions", None,
                                   unit="trials") as advance:
        trials = Trials(model, prepared, config, table, probe, units, *budget, progress=advance,
                        quick_probe=probe.ranking(QUICK_SAMPLES), executor=executor, force=force)
        trials.seed(result)  # the all-int8 candidate is the model just made
        base, ratio, floors = _measure_and_rescue(outcome, trials)
    if vf.enabled:
        all_float = _all_float(result, outcome)
        outcome.verification = verification_of(plan, probe, base, ratio, floors, config, all_float)
        if vf.min_memory_reduction is not None:  # a gate only: promotions would hold more, not less
            outcome.verification.checks.append(memory_check(probe, outcome.result.model, vf.min_memory_reduction))
        # the clock's figure beside the prediction's, never deciding; none for a model computing in
        # float like the user's (nothing quantized, or weight-only: its weights folded at load)
        if probe.predicts and ratio is not None and all_float is None and not outcome.weight_only:
            with phase("verify"), phase("time"):
                outcome.verification.measured = probe.timed_ratio(outcome.result.model)
    return outcome


def _floor_predicted(config: Config) -> bool:
    """Whether the run judges latency by the target profile's prediction against a floor: then
    the preparation passes predicted to make the user's model slower are left out."""
    vf = config.verify
    return vf.enabled and vf.max_latency_ratio is not None and vf.latency == "predicted"


def _no_calibration(model: onnx.ModelProto, prepared: PrepareResult, config: Config,
                    strict: bool) -> tuple[CalibrationTable, str]:
    """The empty calibration table of a config whose plan calibrates no tensor (every quantized
    node dynamic, or weights only), and why verification without --eval-data is skipped; a
    QcliError when the plan needs calibration data."""
    plan = make_plan(prepared.model, config)
    check_unmatched(plan, strict)
    if plan.calibrated_tensors:
        hint = ("only a config that calibrates nothing (activations.mode: dynamic, or weights only) needs "
                "neither" + (f"; {len(plan.calibrated_tensors)} tensors here are quantized statically"
                             if plan.dynamic else ""))
        raise QcliError("give exactly one of --data DIR (calibrate now) or --calib FILE", hint=hint)
    widen = sorted(set(config.auto_precision.candidates) & {"int16", "uint16"})
    if config.auto_precision.enabled and widen:
        raise QcliError(f"auto-precision's {widen[0]} candidates need calibration data",
                        hint="give --data DIR, or set auto_precision.candidates without them")
    why = ("a dynamic model needs no calibration data" if plan.at_run_time else
           "this config calibrates nothing, so no --data was given")
    table = CalibrationTable(fingerprint(model), {}, 0, RangeSettings.of(config))
    return table, f"{why}; give --eval-data to verify"


def _measure_and_rescue(outcome: Outcome, trials: Trials) -> tuple[Fidelity, float | None, Goal]:
    """The int8 model measured against the floors; the search when auto-precision is on or a
    floor is missed (and `verify.rescue`). Returns the final fidelity, latency ratio (when the
    latency floor applies) and the floors."""
    config = outcome.config
    ap, vf = config.auto_precision, config.verify
    base = trials.fidelity({})
    if base is None:
        raise InternalError("the int8 model just built could not be measured")
    floors = _floors(config, trials.probe) if vf.enabled else Goal()
    goal = floors
    if ap.enabled:
        wanted = goal_of(config)
        ceiling = min((r for r in (wanted.max_latency_ratio, floors.max_latency_ratio) if r is not None), default=None)
        goal = replace(floors, criterion=wanted.criterion, max_drop=wanted.max_drop, max_latency_ratio=ceiling,
                       max_bytes=wanted.max_bytes)
    exact = trials.probe.predicts
    goal = tolerant(goal, exact)
    trials.ceiling = goal.max_latency_ratio
    timed, accurate = floors.max_latency_ratio is not None, floors.accurate(base)
    # a rescue the fidelity needs anyway goes float in one trial when int8 cannot pay off
    # (`_no_payoff`): one timing shows that; the verdict's further timings (`Trials.latency`)
    # come only where a latency verdict is taken
    ratio: float | None = trials.latency({}, settle=accurate) if timed else None
    rescues = (not ap.enabled and vf.rescue and bool(trials.units)
               and not (accurate and latency_ok(floors, ratio, exact)))
    no_payoff = _no_payoff(outcome.result, trials, ratio) if rescues else None
    if timed and no_payoff is None:
        ratio = trials.latency({})  # settled, for the search's latency verdicts
    needed = ap.enabled or (vf.rescue and not (accurate and latency_ok(floors, ratio, exact)))
    if not (needed and trials.units):
        return base, ratio, floors
    tried: list[Stored | None] = []  # the weight-only model, once tried

    def instead(choices: Choices, settled: bool) -> Fidelity | None:
        """The weight-only model's fidelity when it meets the goal, tried as soon as the
        search's next prefix to confirm is mostly float (or everything promoted, when the goal
        needs most units): then no prune of that prefix would be written
        (docs/guides/verification.md). Timed against the prefix when that computes in int8 somewhere (the
        weight-only one must not be slower): then only once the prefix is `settled` (confirmed,
        or everything promoted), the model the search would write (Silero's unconfirmed int8
        convolutions were faster)."""
        if tried or not mostly_float(trials, current := trials.build(choices)):
            return None
        timed = floors.max_latency_ratio is not None and current.plan.quantizes
        if timed and not settled:
            return None
        tried.append(weight_only(trials, goal, current, trials.latency(choices) if timed else None))
        return tried[0].fidelity if tried[0] is not None else None

    int8 = outcome.result  # the rescue replaces outcome.result with what it found
    stores = not ap.enabled and _dynamic_scheme(config)
    rounds = config.weights.from_data or config.recovery.rounds  # weight-only models from each fold's data too
    if no_payoff is not None and not rounds:  # everything float: one model for every fold, whose ranges it never reads
        outcome.table.folds = []
    found = _rescue(outcome, trials, goal, no_payoff, instead if stores else None)
    # only the search's candidates are built from the fold tables: their histograms go now
    # (what follows builds from the whole table; tashkeel's peak 196-202 -> 185-187 MB)
    if not rounds:
        outcome.table.folds = []
    if found.choices:
        if found.fidelity is None:
            raise InternalError("the search chose a candidate it could not measure")
        base = found.fidelity
        ratio = found.latency_ratio if floors.max_latency_ratio is not None else None
        replaced = bool(tried and tried[0])  # by the weight-only model, timed on its own
        if ratio is None and floors.max_latency_ratio is not None and not (
                replaced or fast_by_construction(floors, _all_float(int8, outcome), exact)):
            ratio = trials.latency(found.choices)
    stored = (tried[0] if tried else weight_only(trials, goal, outcome.result, ratio)) if stores else None
    if stored is not None:  # mostly float after the rescue: int8 weights, float compute, instead
        outcome.result, outcome.config, outcome.promoted, outcome.reasons = stored.result, stored.config, {}, {}
        outcome.goal_met = outcome.weight_only = True
        outcome.notes.append(stored.note)
        base, ratio = stored.fidelity, stored.ratio if floors.max_latency_ratio is not None else None
    if exact and ratio is None and floors.max_latency_ratio is not None:  # a prediction judges every model
        ratio = trials.probe.latency_ratio(outcome.result.model)
    return base, ratio, floors


def _rescue(outcome: Outcome, trials: Trials, goal: Goal, no_payoff: str | None,
            instead: Callable[[Choices, bool], Fidelity | None] | None) -> SearchResult:
    """The search for `goal` (`no_payoff`: why it would be in vain; `instead`: `search`'s), and
    the outcome made of what it found."""
    config, ap = outcome.config, outcome.config.auto_precision
    # a 16-bit promotion takes the activations' signedness (`promoted_config`): uint16 names it too
    candidates = [_SAME_PROMOTION.get(c, c) for c in ap.candidates] if ap.enabled else list(RESCUE_CANDIDATES)
    untimed = not ap.enabled and (no_payoff is not None or goal.max_latency_ratio is None
                                  or goal.fast(trials.latency({})))  # no payoff: everything float anyway
    with phase("search"):
        costs = _untimed(trials) if untimed else trials.costs(candidates)
        found = search(trials.units, trials, goal, costs, shrink="int4" in candidates, candidates=candidates,
                       dynamic_first=not ap.enabled and _dynamic_scheme(config), no_payoff=no_payoff,
                       instead=instead)
    outcome.search, outcome.goal_met = found, found.met
    outcome.promoted = found.choices
    outcome.reasons = reasons(found)
    outcome.config = promoted_config(config, found.choices, trials.units)  # search off: reproduces it
    if found.choices:
        outcome.result = trials.build(found.choices)  # quantized with outcome.config
        _explain(outcome, whys(found), {u.node for u in trials.units if u.half})
    if not found.met and not found.costs:  # no unit has a promotion it could take
        outcome.notes.append(_no_promotion(config, ap.candidates))
    if (overran := trials.overran()) is not None:
        outcome.notes.append(overran)
    if found.stopped:
        knobs = "--max-trials" if ap.enabled else "verify.max_trials"
        outcome.notes.append(f"search stopped early: {found.stopped}; the result is safe but coarse "
                             f"(more promoted than needed): raise {knobs} for a finer one")
    return found


def _no_payoff(int8: QuantizeResult, trials: Trials, ratio: float | None) -> str | None:
    """Why no mix of int8 and float units can pay off, when none can: the all-int8 model keeps
    more than SAVES of the float model's weight bytes (weights read by a Loop, or by ops with no
    int8 form, stay float) and is not measurably faster than float (its latency interval reaches
    1 - LATENCY_TOLERANCE: a model at parity must not flip between searching and not with the
    draw; or the model is too fast to time). A mix then saves less than a quarter of the bytes
    and runs no faster, so the rescue goes float in one trial instead of searching
    (docs/guides/verification.md)."""
    float_bytes, int8_bytes = weight_bytes(trials.prepared.model)[0], weight_bytes(int8.model)[0]
    if not float_bytes or int8_bytes <= SAVES * float_bytes or (
            ratio is not None and getattr(ratio, "high", ratio) < 1 - LATENCY_TOLERANCE):
        return None
    speed = "too fast to time" if ratio is None else f"at {float(ratio):.2f}x float's latency"
    return f"int8 would not pay off: all int8 keeps {int8_bytes / float_bytes:.2f} of the weight bytes, {speed}"


def _untimed(trials: Trials) -> Costs:
    """The rescue's costs without the profiles, when the all-int8 model is fast enough (or no
    mix can pay off: every unit goes float in one trial): the search then never promotes for
    speed, and promotes to dynamic or float by fixed rules (`SearchState.smaller`), so kernel
    times would change nothing; every unit can go float."""
    return {u.node: ("float", 0.0) for u in trials.units}


_SAME_PROMOTION = {"uint16": "int16", "uint8": "int8"}


def _dynamic_scheme(config: Config) -> bool:
    """Whether the config's static scheme is the one a dynamic form keeps: uint8 asymmetric
    activations (onnxruntime's CPU pairing, what DynamicQuantizeLinear computes) and 8-bit
    weights, stored the same (a 4-bit or weight-only config's would grow; an int8 symmetric
    one, TensorRT's, reads Q/DQ pairs, not onnxruntime's dynamic kernels).

    >>> trt = Config.model_validate({"activations": {"dtype": "int8", "symmetric": True}})
    >>> int4 = Config.model_validate({"weights": {"dtype": "int4"}})
    >>> _dynamic_scheme(Config()), _dynamic_scheme(trt), _dynamic_scheme(int4)
    (True, False, False)
    """
    a = config.activations
    return a.dtype == "uint8" and not a.symmetric and config.weights.dtype in ("int8", "uint8")


RESCUE_CANDIDATES = ("dynamic", "float")  # the rescue's promotions: dynamic int8 tried before float


def _no_promotion(config: Config, candidates: Sequence[str]) -> str:
    """Why the search could promote no unit (the goal missed): what the candidates allow."""
    if not {"int16", "uint16", "dynamic"} & set(candidates):
        why = "they hold neither dynamic, int16 nor float"
    elif not {"int16", "uint16"} & set(candidates):
        why = "no node here has a dynamic form (MatMul, Gemm or LSTM with a constant weight, quantized statically)"
    elif config.activations.dtype == "float":
        why = "under float activations int16 widens weights, and no unit here has one of its own"
    else:
        why = "int16 needs activations this calibration did not measure"
    return (f"no unit can be promoted with auto_precision.candidates [{', '.join(candidates)}]: {why}; the model "
            "stays as the config made it (add float to the candidates to promote units)")


def _all_float(int8: QuantizeResult, outcome: Outcome) -> str | None:
    """Why the model written has no quantized node left, if so."""
    if int8.half is not None and int8.half.converted:
        return None
    if not int8.plan.quantizes:
        return ("nothing to quantize: no node of this model has an int8 form here (the node table says why "
                "each stays float); the model written computes like the original")
    if not outcome.result.plan.quantizes:
        return ("nothing is left quantized: the model computes in float like the original (int8 did not pay off "
                "here)")
    return None


def _floors(config: Config, probe: Probe) -> Goal:
    vf = config.verify
    ceiling = vf.max_latency_ratio
    if ceiling is not None and probe.float_ms() < vf.min_float_ms:
        ceiling = None
    return Goal("performance", None, vf.min_top1_agreement, vf.min_cosine, ceiling, vf.max_relative_error,
                vf.max_perplexity_increase, vf.min_token_agreement, vf.max_token_kl,
                min_spatial_agreement=vf.min_spatial_agreement)


def _explain(outcome: Outcome, why_of: dict[str, tuple[Why, str]], half: set[str]) -> None:
    """Nodes the search promoted to float say why in the plan (not "excluded by config");
    `half`: the units that were float16/bfloat16."""
    for k, d in enumerate(outcome.result.plan.nodes):
        if outcome.promoted.get(d.name) == "float":
            was = str(outcome.config.half) if d.name in half else "8 bits"
            why = in_plan(why_of[d.name][0], was) if d.name in why_of else "promoted"
            outcome.result.plan.nodes[k] = replace(d, reason=f"{why} (precision search)")
