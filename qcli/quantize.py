"""The library's two verbs on a float model, the stages wired one way (DESIGN.md §5):

- `calibrate`: prepare -> plan -> observe exactly the tensors the plan quantizes over one pass
  of the data -> every method's ranges (a CalibrationTable);
- `quantize`: prepare -> plan -> ranges from the table -> materialize, with metadata
  (`qcli.version`, `qcli.config`, `qcli.calibration`) saying how the model was made.

Both prepare with `prepare_for(model, config)`: at opset 21 when the config asks for per-block
weights, so that the graph the plan indexes is the one calibration, verification and the
precision search read too (a caller passing `prepared` gets it from there).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import onnx

from qcli import __version__, awq, gptq, hqq
from qcli.calibrate.collect import Collected, collect
from qcli.calibrate.pool import started
from qcli.calibrate.ranges import RangeSettings
from qcli.calibrate.shards import Fold, collect_folds, collect_sharded, merged_except
from qcli.calibrate.table import METHODS, CalibrationTable, build_tables
from qcli.config import FLOAT8, Config, config_document
from qcli.data import DataFolder
from qcli.errors import ConfigError
from qcli.executor import Executor, SerialExecutor
from qcli.graph import GraphIndex, opset_version
from qcli.half import BFLOAT16_OPSET, HalfResult, to_half
from qcli.lazy import tensor_array
from qcli.model import fingerprint
from qcli.phases import phase
from qcli.plan import Plan, assign_ranges, make_plan
from qcli.prepare import BLOCK_OPSET, TARGET_OPSET, PrepareResult, prepare
from qcli.qdq import materialize
from qcli.qweights import WeightMemo
from qcli.recovery import bias, check_table, graph_steps
from qcli.recovery.equalize import equalize
from qcli.recovery.rounding import Rounding
from qcli.recovery.smoothquant import channel_requests, find_targets, smooth
from qcli.scheme import FLOAT8_OPSET, TWO_BIT_OPSET, PerBlock


@dataclass
class QuantizeResult:
    model: onnx.ModelProto
    plan: Plan
    notes: list[str] = field(default_factory=list)  # what prepare changed, and warnings
    recovery: dict = field(default_factory=dict)  # step -> what it changed (summary, JSON)
    planned: onnx.ModelProto | None = None  # the float graph the plan indexes (recovery may add nodes)
    half: HalfResult | None = None  # the nodes run in float16/bfloat16, and those kept float32


def calibrate(
    model: onnx.ModelProto,
    folder: DataFolder,
    config: Config,
    *,
    progress: Callable[[int], None] | None = None,
    force: bool = False,
    strict: bool = False,
    methods: tuple[str, ...] = METHODS,
    prepared: PrepareResult | None = None,
    executor: Executor | None = None,
    folds: list[Fold] | None = None,
) -> CalibrationTable:
    """Observe the activations `config`'s quantization needs over `folder` and solve the
    ranges of `methods` (default all four) for the configured activation dtype.

    The histograms keep at least `bins` bins across each tensor's range (twice that at most),
    which is what the KL solver works on. The table is keyed to the fingerprint of `model`
    as given (before preparation), which is what `quantize` checks. `prepared`: the result of
    `prepare_for(model, config)` when the caller has it already (it is not changed).
    `executor`: the pass runs in its workers, split into one shard of the folder per worker,
    and the shards' statistics are merged, exactly: the table is the same as one process's.
    None, or a `SerialExecutor`: the pass runs here.
    `folds` (k-fold verification, `plan_folds`): the same pass keeps each fold's statistics
    apart; the table is the same, and `table.folds[k]` is the table of every fold but k.
    """
    work, plan, options = _observing(model, config, progress, force, strict, prepared)
    searches = len(set(plan.observed_tensors)) * sum(m != "minmax" for m in methods) * (1 + len(folds or ()))
    with started(searches) as helper:  # the solves' helper process imports during the pass
        if folds:
            with phase("observe"):
                parts = collect_folds(work, folder, folds, executor, reference=model, **options)
            with phase("solve"):
                tables = _tables([merged_except(parts, k) for k in [None, *range(len(parts))]], model, config,
                                 methods, plan.unmatched, helper)
            tables[0].folds = tables[1:]  # the table of every fold but k
            return tables[0]
        with phase("observe"):
            if executor is None or isinstance(executor, SerialExecutor):
                collected = collect(work, folder, reference=model, **options)
            else:
                collected = collect_sharded(work, folder, executor, **options)
        with phase("solve"):
            return _tables([collected], model, config, methods, plan.unmatched, helper)[0]


def _observing(model: onnx.ModelProto, config: Config, progress: Callable[[int], None] | None, force: bool,
               strict: bool, prepared: PrepareResult | None) -> tuple[onnx.ModelProto, Plan, dict[str, Any]]:
    """The graph calibration runs and the options of its pass (what `collect` observes)."""
    work = (prepared or prepare_for(model, config, force=force)).model
    plan = make_plan(work, config)
    check_unmatched(plan, strict)
    options: dict[str, Any] = dict(
        batch_size=config.calibration.batch_size,
        tensors=plan.observed_tensors,
        max_bins=2 * config.calibration.bins,
        progress=progress,
        channels=recovery_channels(work, config, plan),
    )
    return work, plan, options


def _tables(parts: list[Collected], model: onnx.ModelProto, config: Config, methods: tuple[str, ...],
            unmatched: list[str], helper: subprocess.Popen | None = None) -> list[CalibrationTable]:
    """The calibration table of what each pass (or fold) collected, their ranges solved for
    `methods` together (`helper`: the solves' helper process, `pool.started`)."""
    tables = build_tables([(c.observers, c.samples, c.aliases) for c in parts], fingerprint(model),
                          RangeSettings.of(config), methods, helper)
    for table, collected in zip(tables, parts, strict=True):
        table.channels = collected.channels
        table.warnings += [f"config rule {text}" for text in unmatched]
        table.graph_steps = graph_steps(config)
    return tables


def quantize(
    model: onnx.ModelProto,
    config: Config,
    table: CalibrationTable,
    *,
    force: bool = False,
    strict: bool = False,
    prepared: PrepareResult | None = None,
    restrict: Callable[[Plan, onnx.ModelProto], Plan] | None = None,
    lean: bool = False,
) -> QuantizeResult:
    """Quantize `model` with the ranges of `table` (solved for `config`'s method and dtype).
    `strict`: a config rule that matches nothing raises ConfigError instead of a warning.
    `prepared`: the result of `prepare_for(model, config)` when the caller has it already (not
    changed). `restrict(plan, graph)`: a last change to the plan, its ranges assigned, before it
    is materialized (the sensitivity report's one-unit models: `qcli.precision.units.alone`).
    `lean`: a model for onnxruntime sessions only, never written (qcli.qdq.materialize: the
    float weights it keeps are references to the prepared model's, when `prepared` is reused)."""
    if table.observers:
        check_table(config, table.graph_steps)
    reused = prepared is not None  # by several builds: its memo of quantized weights pays
    prepared = prepared or prepare_for(model, config, force=force)
    work, table, smoothed, scaled = recover(prepared.model, config, table)
    notes = list(prepared.notes)
    index = GraphIndex.of(work)
    plan = plan_for(work, config, table, index=index, strict=strict, restrict=restrict)
    settings = RangeSettings.of(config)
    recovery = {**prepared.recovery, **smoothed}
    source = correct_biases(work, plan, config, table, recovery, notes)
    memo = prepared.quantized if reused and source is prepared.model else None  # weights changed: no memo
    rounding = Rounding.of(config)
    if config.weights.algorithm == "gptq" or rounding is not None:
        memo = _gptq_rounded(source, plan, table, notes, rounding=rounding)
        if rounding is not None:
            recovery[rounding.steps[-1]] = rounding.report(table.rounding_sqnr, plan)
    elif config.weights.algorithm == "hqq":
        memo = _hqq_rounded(source, plan, prepared.quantized if source is prepared.model else WeightMemo(), notes)
    elif scaled is not None:
        memo = _awq_rounded(source, plan, table, scaled, notes)
    lean = lean and not (plan.half and config.half)  # the 16-bit rewrite reads the float weights
    out = materialize(source, plan, index if source is work else GraphIndex.of(source), memo, lean)
    half = None
    if plan.half and config.half:
        wanted = {work.graph.node[i].output[0] for i in plan.half}
        half = to_half(out, wanted, config.half, table if table.observers else None)
        out = half.model
        notes += half.notes()
    _keep_own_value_info(out, model)
    calibration = {"method": settings.method, "samples": table.samples, "fingerprint": table.fingerprint}
    own = {"qcli.version": __version__, "qcli.config": _compact_json(_recipe(config)),
           "qcli.calibration": _compact_json(calibration)}
    # a model qcli wrote before (computing in float: nothing refused it) carries these keys already
    kept = [(p.key, p.value) for p in out.metadata_props if p.key not in own]
    del out.metadata_props[:]
    for key, value in [*kept, *own.items()]:
        entry = out.metadata_props.add()
        entry.key, entry.value = key, value
    notes += plan.notes
    notes += [f"warning: config rule {text}" for text in plan.unmatched]
    return QuantizeResult(out, plan, notes, recovery, work, half)


def plan_for(work: onnx.ModelProto, config: Config, table: CalibrationTable, *, index: GraphIndex | None = None,
             strict: bool = False, restrict: Callable[[Plan, onnx.ModelProto], Plan] | None = None) -> Plan:
    """The plan of `work` (the graph the build edits) under `config`, its ranges from `table`:
    what `quantize` materializes, and what the simulation is fed (qcli.simulation)."""
    plan = make_plan(work, config, index=index)
    check_unmatched(plan, strict)
    if _per_block(plan) and opset_version(work) < BLOCK_OPSET:
        raise ValueError(f"per-block weights need the model prepared at opset {BLOCK_OPSET}: "
                         "pass prepare_for(model, config)")
    assign_ranges(plan, work, table, RangeSettings.of(config))
    return restrict(plan, work) if restrict is not None else plan


def recovery_channels(work: onnx.ModelProto, config: Config, plan: Plan) -> dict[str, int]:
    """Tensor -> axis: the per-channel statistics the recovery steps need from the calibration
    pass (SmoothQuant's targets), none without them."""
    if config.recovery.smoothquant is None:
        return {}
    return channel_requests(find_targets(work, config, plan))


def recover(work: onnx.ModelProto, config: Config, table: CalibrationTable
            ) -> tuple[onnx.ModelProto, CalibrationTable, dict, awq.Scaled | None]:
    """The steps that change the prepared float graph before planning (SmoothQuant, AWQ): the
    graph to plan, the table with the changed tensors' ranges, what each step did, and AWQ's
    changes to the weights (None without it)."""
    if config.weights.algorithm == "awq":
        scaled = awq.scaled(work, make_plan(work, config), table.grams)
        return scaled.model, table, {"awq": [layer.to_dict() for layer in scaled.layers]}, scaled
    if config.recovery.smoothquant is None:
        return work, table, {}, None
    smoothed = smooth(work, config, table)
    return smoothed.model, smoothed.table, {"smoothquant": [layer.to_dict() for layer in smoothed.layers]}, None


def _compact_json(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))


def _keep_own_value_info(out: onnx.ModelProto, model: onnx.ModelProto) -> None:
    """Keep only the value_info the input model carried. The shapes `prepare` inferred were for
    planning; written, they would annotate some tensors and not the new Q/DQ ones, and
    onnxruntime infers them all at load anyway (on a small model they are ~1% of the file)."""
    own = {v.name for v in model.graph.value_info}
    kept = [v for v in out.graph.value_info if v.name in own]
    del out.graph.value_info[:]
    out.graph.value_info.extend(kept)


def _recipe(config: Config) -> dict:
    """The config as the model's metadata records it: what decides the model's content. The
    `verify` and `auto_precision` sections check and search; what they changed is in the
    overrides (the precision config), so they are left out; so is a `prepare` section that
    leaves nothing out (every pass ran: what models written before the key existed record)."""
    doc = config_document(config)
    for section in ("verify", "auto_precision"):
        doc.pop(section, None)
    if not config.prepare.skip:
        doc.pop("prepare", None)
    return doc


def check_unmatched(plan: Plan, strict: bool) -> None:
    if strict and plan.unmatched:
        raise ConfigError(f"config rule {plan.unmatched[0]}", hint="fix the rule, or drop --strict to only warn")


def prepare_for(model: onnx.ModelProto, config: Config, *, force: bool = False) -> PrepareResult:
    """`prepare(model)` for quantizing with `config`: at opset BLOCK_OPSET when the config asks
    for per-block weights anywhere (DequantizeLinear's block_size), at BFLOAT16_OPSET for
    bfloat16 nodes (Conv, Gemm, Relu... take bfloat16 from it), at FLOAT8_OPSET for float8
    Q/DQ, else at prepare's default.
    The opset converter may add nodes (ReduceMean's axes become a Constant input at 18), so the
    upgrade is a preparation step and every stage gets this one graph. Decided on the config,
    not its plan: the precision config a search writes (the same weights sections, some nodes
    promoted) then prepares the same graph and reproduces the model exactly. The passes in
    `prepare.skip` are left out. The recovery steps
    that change the float graph run last (`recover_graph`)."""
    opset = BLOCK_OPSET if _asks_blocks(config) else TARGET_OPSET
    if config.half == "bfloat16":
        opset = max(opset, BFLOAT16_OPSET)
    if _asks_float8(config):
        opset = max(opset, FLOAT8_OPSET)
    if _asks_two_bits(config):
        opset = max(opset, TWO_BIT_OPSET)
    prepared = prepare(model, force=force, opset=opset, skip=config.prepare.skip)
    return recover_graph(prepared, config)


def recover_graph(prepared: PrepareResult, config: Config) -> PrepareResult:
    """The recovery steps on the prepared float graph, in place: equalization (weights only,
    the float model computes the same); what each did in `prepared.recovery` and its notes.
    Bias correction gives bias-less nodes a zero bias here, for its corrections to go into."""
    step = config.recovery.equalization
    if step is not None:
        done = equalize(prepared.model, step.iterations)
        prepared.recovery["equalization"] = done.to_dict()
        prepared.notes.extend(done.notes)
    if config.recovery.bias_correction is not None:
        bias.add_zero_biases(prepared.model, config.recovery.bias_correction.op_types)
    return prepared


def measure_bias_shifts(model: onnx.ModelProto, config: Config, table: CalibrationTable,
                        folders: Sequence[DataFolder], *, prepared: PrepareResult,
                        progress: Callable[[int], None] | None = None) -> None:
    """Bias correction's shifts (qcli.recovery.bias), measured on the all-int8 model `config`
    makes with `table`, over `folders` (the samples `table` was calibrated on); kept on `table`,
    which every later `quantize` with it (the rescue's rebuilds too) applies."""
    step = config.recovery.bias_correction
    assert step is not None
    table.bias_shifts = {}  # the int8 model as it is before any correction
    int8 = quantize(model, config, table, prepared=prepared)
    planned = int8.planned or prepared.model  # the graph the plan indexes (SmoothQuant may add nodes)
    found, _ = bias.targets(planned, int8.plan, step.op_types)
    table.bias_shifts = bias.measure(planned, int8.model, found, folders, config.calibration.batch_size, progress)


def measure_grams(model: onnx.ModelProto, config: Config, table: CalibrationTable, folders: Sequence[DataFolder],
                  *, prepared: PrepareResult, progress: Callable[[int], None] | None = None) -> None:
    """AWQ's Gram matrices and mean |x| (qcli.awq) of the inputs of the weights `config`
    quantizes, over `folders` (the samples `table` was calibrated on), through the prepared float
    graph; kept on `table` for every later `quantize` with it (GPTQ's: `fold_grams`)."""
    work = prepared.model
    plan = make_plan(work, config)
    table.grams = awq.measure(work, awq.requests(awq.targets(work, plan), plan), folders, progress)


def fold_grams(config: Config, parts: Sequence[Sequence[DataFolder]], *, prepared: PrepareResult,
               progress: Callable[[int], None] | None = None) -> tuple[dict, list[dict]]:
    """GPTQ's Gram matrices for `config`'s weights over all of `parts` (the model written), and
    over all but each part (its fold's model, when there are several), in one pass of each
    group (qcli.gptq.measure_parts); ({}, []) when GPTQ rounds none of them."""
    work = prepared.model
    found = gptq.targets(work, make_plan(work, config))
    if not found:
        return {}, []
    each = gptq.measure_parts(work, found.values(), parts, config.calibration.batch_size, progress)
    folds = [gptq.summed(each, k) for k in range(len(each))] if len(each) > 1 else []
    return gptq.summed(each), folds


def gram_passes(config: Config, prepared: PrepareResult) -> int:
    """How many passes over the data `measure_grams` (AWQ) or `fold_grams` (GPTQ) makes
    (qcli.gptq.passes)."""
    work = prepared.model
    if config.weights.algorithm == "awq":
        return 1
    return len(gptq.passes(work, gptq.targets(work, make_plan(work, config)).values()))


def gptq_weights(config: Config, prepared: PrepareResult) -> int:
    """How many weights `round_gptq` rounds (for a progress bar's total)."""
    return len(gptq.targets(prepared.model, make_plan(prepared.model, config)))


def round_gptq(config: Config, table: CalibrationTable, *, prepared: PrepareResult,
               progress: Callable[[int], None]) -> None:
    """Round now, by GPTQ on `table`'s Gram matrices, every weight `config`'s plan gives it
    (`progress(1)` after each), for the builds with `table` to take."""
    _gptq_rounded(prepared.model, make_plan(prepared.model, config), table, [], lambda: progress(1),
                  Rounding.of(config))


def correct_biases(work: onnx.ModelProto, plan: Plan, config: Config, table: CalibrationTable, recovery: dict,
                   notes: list[str]) -> onnx.ModelProto:
    """`work`, or a copy with bias correction's shifts taken out of the biases of the nodes
    `plan` quantizes as they were measured; what it did in `recovery` and `notes`."""
    step = config.recovery.bias_correction
    if step is None:
        return work
    if table.bias_shifts is None:
        raise bias.needs_data()
    found, skipped = bias.targets(work, plan, step.op_types)
    source, done = bias.corrected(work, found, table.bias_shifts)
    recovery["bias_correction"] = done
    notes.extend(skipped)
    largest = done.get("largest_shift")
    notes.append(f"bias correction: corrected {done['nodes']} node(s)" + (
        f"; largest shift {largest['value']:.3g} ({largest['node']})" if largest else ""))
    return source


def _gptq_rounded(source: onnx.ModelProto, plan: Plan, table: CalibrationTable, notes: list[str],
                  done: Callable[[], None] | None = None, rounding: Rounding | None = None) -> WeightMemo:
    """`table`'s memo (`rounded`) holding the weights GPTQ (or `rounding`'s recovery steps,
    their SQNRs on `table`) rounds on its Gram matrices under their plans, which the build
    takes instead of rounding to nearest; each solved once per table and plan (`done()` after
    each). A memo of the table's own: a fold's table rounds on its own samples' matrices."""
    if table.grams is None:
        raise gptq.needs_data(rounding.steps[0] if rounding else None)
    memo = table.rounded = table.rounded or WeightMemo()
    wanted = {name for name, wp in plan.weights.items() if ("qdq", wp) not in memo.weights}
    rounder = rounding.rounder(table.rounding_sqnr) if rounding else None
    for name, weight in gptq.solve(source, plan, table.grams, wanted, rounder):
        memo.put(("qdq", plan.weights[name]), weight, plan.weights[name])
        if done is not None:
            done()
    notes.extend(gptq.notes(source, plan, ", ".join(rounding.steps) if rounding else "gptq"))
    return memo


def hqq_weights(config: Config, prepared: PrepareResult) -> int:
    """How many weights `round_hqq` rounds (for a progress bar's total)."""
    return len(hqq.targets(make_plan(prepared.model, config)))


def round_hqq(config: Config, *, prepared: PrepareResult, progress: Callable[[int], None]) -> None:
    """Round now, by HQQ, every weight `config`'s plan gives it (`progress(1)` after each), into
    the prepared model's memo that the builds take them from."""
    _hqq_rounded(prepared.model, make_plan(prepared.model, config), prepared.quantized, [], lambda: progress(1))


def _hqq_rounded(source: onnx.ModelProto, plan: Plan, kept: WeightMemo, notes: list[str],
                 done: Callable[[], None] | None = None) -> WeightMemo:
    """A memo for this build holding the weights HQQ rounds (qcli.hqq), each solved once and
    kept in `kept` (the prepared model's memo: HQQ reads no data, so every fold and build shares
    it) under its plan (`done()` after each)."""
    memo = WeightMemo()
    found = hqq.targets(plan)
    wanted = {name for name, wp in found.items() if ("hqq", wp) not in kept.weights}
    for name, weight in hqq.solve(source, plan, wanted):
        kept.put(("hqq", plan.weights[name]), weight, plan.weights[name])
        if done is not None:
            done()
    for wp in found.values():
        if ("hqq", wp) in kept.weights:
            memo.weights[("qdq", wp)] = kept.weights[("hqq", wp)]
    notes.extend(hqq.notes(plan, {wp.name for wp in found.values() if ("hqq", wp) in kept.weights}))
    return memo


def _awq_rounded(source: onnx.ModelProto, plan: Plan, table: CalibrationTable, scaled: awq.Scaled,
                 notes: list[str]) -> WeightMemo:
    """A memo for this build holding the weights AWQ changes, scaled and rounded (qcli.awq),
    each kept in `table`'s memo (`rounded`) under its plan and change for the builds after."""
    kept = table.rounded = table.rounded or WeightMemo()
    memo = WeightMemo()
    inits = GraphIndex.of(source).initializers
    for name, change in scaled.changes.items():
        wp = plan.weights.get(name)
        if wp is None or wp.scheme.dtype.is_float:
            continue
        key = ("awq", wp, change.key())
        if key not in kept.weights:
            kept.put(key, awq.rounded(tensor_array(inits[name]), wp, change, table.grams or {}), wp)
        memo.weights[("qdq", wp)] = kept.weights[key]
    notes.extend(awq.notes(scaled.changes, plan, scaled.layers))
    return memo


def _asks_blocks(config: Config) -> bool:
    sections = [config.weights, *(o.weights for o in config.overrides)]
    return any(w is not None and w.granularity == "per_block" for w in sections)


def _asks_float8(config: Config) -> bool:
    """Whether the config quantizes anything to a float8 type (Q/DQ take them from opset 19)."""
    sections = [config.activations, config.weights, *(s for o in config.overrides for s in (o.activations, o.weights))]
    return any(s is not None and s.dtype in FLOAT8 for s in sections)


def _asks_two_bits(config: Config) -> bool:
    """Whether the config stores any weight in 2 bits (DequantizeLinear takes them from opset 25)."""
    sections = [config.weights, *(o.weights for o in config.overrides)]
    return any(w is not None and w.dtype in ("int2", "uint2") for w in sections)


def _per_block(plan: Plan) -> bool:
    return any(isinstance(w.scheme.granularity, PerBlock) for w in plan.weights.values())
