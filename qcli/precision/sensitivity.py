"""Sensitivity: what each quantized unit costs on its own, and what keeping it float gains
(`qcli analyze --sensitivity`, docs/guides/analysis.md).

The quantized model's metadata says how qcli made it (`qcli.config`, `qcli.calibration`): the
same plan is rebuilt and calibrated again on the data folder, which `qcli.holdout` splits into
calibration and compared samples as verification does. Then per unit (qcli.precision.units),
measured by `Trials` (cached, on the executor's workers, within a trial and time budget):
- alone: the float model with only that unit quantized as in the model (`units.alone`),
  against the float model;
- kept float: the model with that unit float and everything else as quantized (the precision
  search's sensitivity trial), against the model.
Each by the figures verification gates on (each output by its kind, against the float model,
not labels: a loss is the largest over the gated outputs of 1 - agreement, 1 - cosine and the
plug-in metric's shortfall) and by the output noise (`Fidelity.noise`, over the same outputs).
Ranked by the noise keeping the unit float removes (what the precision search ranks by: it is
continuous, where an agreement on n samples moves in steps of 1/n and a gain of one sample is
mostly chance), then the loss it removes, then the unit's noise and loss alone, then its name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import onnx

from qcli.analyze.fidelity import Fidelity
from qcli.analyze.probe import Probe
from qcli.analyze.report import Sensitivity, UnitSensitivity, rounded
from qcli.calibrate.ranges import RangeSettings
from qcli.calibrate.table import CalibrationTable
from qcli.census import precision_labels
from qcli.config import Config, parse_config
from qcli.data import DataFolder, model_inputs
from qcli.errors import ConfigError, QcliError
from qcli.holdout import DataPlan, calibrate_planned, make_probe, plan_data
from qcli.model import fingerprint
from qcli.phases import ProgressFactory, no_progress
from qcli.plan import make_plan
from qcli.precision.trials import Alone, Candidate, Trials
from qcli.precision.units import Unit, find_units
from qcli.prepare import PrepareResult
from qcli.quantize import (
    QuantizeResult,
    prepare_for,
    quantize,
)


@dataclass(frozen=True)
class Recipe:
    """How qcli made a quantized model, read from its metadata."""

    config: Config  # the resolved config it was quantized with (search choices as overrides)
    samples: int  # the samples its calibration read (0: it calibrated nothing)


def read_recipe(quantized: onnx.ModelProto, label: str, float_model: onnx.ModelProto) -> Recipe:
    """The recipe of `quantized` (named `label` in messages), checked to be made from
    `float_model`; a QcliError (exit 2) when qcli did not write it or made it from another model."""
    meta = {p.key: p.value for p in quantized.metadata_props}
    if "qcli.config" not in meta:
        raise QcliError(f"{label} was not written by qcli (no qcli.config metadata): --sensitivity rebuilds "
                        "the model from how qcli made it",
                        hint="quantize the float model with `qcli quantize` (--no-verify keeps every unit int8), "
                             "or drop --sensitivity")
    try:
        raw, calibration = json.loads(meta["qcli.config"]), json.loads(meta.get("qcli.calibration", "{}"))
    except json.JSONDecodeError as exc:
        raise QcliError(f"{label}: its qcli metadata is not JSON ({exc})",
                        hint="quantize the float model again with `qcli quantize`") from exc
    try:
        config = parse_config(raw, f"{label} (its qcli.config metadata)")
    except ConfigError as exc:
        raise QcliError(exc.message, hint="it was written by another qcli version: quantize the float model again "
                                          "with this one") from exc
    made_from = calibration.get("fingerprint") if isinstance(calibration, dict) else None
    if made_from != fingerprint(float_model):
        raise QcliError(f"{label} was not made from this float model (its qcli.calibration fingerprint "
                        f"{str(made_from)[:19]}... is not the model's {fingerprint(float_model)[:19]}...)",
                        hint="give the float model it was quantized from")
    return Recipe(config, int(calibration.get("samples", 0) or 0))


def measure_sensitivity(
    model: onnx.ModelProto,
    quantized: onnx.ModelProto,
    data: Path,
    config: Config,
    *,
    label: str = "the quantized model",
    progress: ProgressFactory = no_progress,
    executor: Any = None,
    recipe: Recipe | None = None,
) -> Sensitivity:
    """Each unit of `quantized` alone and kept float, measured on `data` (module docstring).
    `config` gives what the metadata does not hold: `verify` (output kinds, metric plug-in),
    `data.preprocess` and the budget (`auto_precision.samples`, `.max_trials`, `.time_budget`).
    `recipe`: `read_recipe`'s, when the caller has checked the models already."""
    recipe = recipe or read_recipe(quantized, label, model)
    config = recipe.config.model_copy(update={
        "verify": config.verify, "auto_precision": config.auto_precision, "data": config.data,
        "calibration": recipe.config.calibration.model_copy(
            update={"samples": recipe.samples or recipe.config.calibration.samples}),
    })
    setup = _rebuild(model, config, data, progress, executor)
    ap = config.auto_precision
    units = setup.units
    with progress("measuring sensitivity", 1 + 2 * len(units), unit="trials") as advance:
        trials = Trials(model, setup.prepared, config, setup.table, setup.probe, units, ap.max_trials, ap.time_budget,
                        progress=advance, executor=executor)
        trials.seed(setup.result)
        found = trials.fidelity({})
        if found is None:
            raise QcliError("the quantized model could not be rebuilt from this calibration")
        base = gated(found)
        kept = _within_budget(trials, [{u.node: "float"} for u in units])
        solo = _within_budget(trials, [Alone(u.node) for u in units]) if len(kept) == len(units) else []
    precisions = precision_labels(setup.result)
    rows = [_row(u, base, _at(kept, k), _at(solo, k), trials.demoted({u.node: "float"}) if k < len(kept) else None,
                 precisions.get(u.node, "int8"))
            for k, u in enumerate(units)]
    notes = []
    rebuilt = fingerprint(setup.result.model) == fingerprint(quantized)
    if not rebuilt:
        notes.append(f"the model rebuilt from {data} differs from {label} (calibrated on other samples, or by "
                     "another qcli version): the measures are of the rebuild")
    if trials.stopped:
        measured = sum(r.float_gain is not None for r in rows)
        notes.append(f"budget spent ({trials.stopped}): {measured} of {len(units)} units kept float, "
                     f"{sum(r.alone_loss is not None for r in rows)} alone; units not measured kept float are "
                     "not ranked (raise --max-trials / --time-budget)")
    if not units:
        notes.append(f"{label} has no quantized unit: nothing to rank")
    return Sensitivity(
        metric=base.metric, source=setup.probe.source, samples=setup.probe.samples, loss=rounded(base.drop),
        noise=rounded(base.noise), rebuilt=rebuilt, trials=trials.count, stopped=trials.stopped,
        units=ranked(rows), notes=notes,
    )


@dataclass
class _Rebuilt:
    prepared: PrepareResult
    table: CalibrationTable
    probe: Probe
    result: QuantizeResult
    units: list[Unit]


def _rebuild(model: onnx.ModelProto, config: Config, data: Path, progress: ProgressFactory, executor: Any
             ) -> _Rebuilt:
    """The model quantized again with `config`, calibrated on `data` (as verification splits it:
    `qcli.holdout`), and the probe comparing candidates on the samples calibration did not read."""
    inputs = model_inputs(model)
    prepared = prepare_for(model, config)
    total = len(DataFolder(data, inputs, reading=config.data.reading))
    count = config.auto_precision.samples
    if make_plan(prepared.model, config).calibrated_tensors:
        plan, table = calibrate_planned(model, config, data, plan_data(data, total, None, config, count), prepared,
                                        progress=progress, executor=executor)
    else:  # every quantized node dynamic, or weights only
        table = CalibrationTable(fingerprint(model), {}, 0, RangeSettings.of(config))
        take = min(total, count)
        plan = DataPlan(None, data, 0, take, f"{data} samples 1-{take} (the model calibrates nothing)")
    probe = make_probe(model, inputs, config, plan, None)
    result = quantize(model, config, table, prepared=prepared)
    return _Rebuilt(prepared, table, probe, result, find_units(result.planned or prepared.model, result.plan))


def gated(f: Fidelity) -> Fidelity:
    """`f` judged as verification gates it: against the float model, labels left out (its `drop`
    is then the largest loss over the gated outputs, each by its kind)."""
    return replace(f, accuracy=None, float_accuracy=None)


def _at(found: list[Fidelity | None], k: int) -> Fidelity | None:
    """The k-th measurement, `gated`; None when it was not measured."""
    f = found[k] if k < len(found) else None
    return None if f is None else gated(f)


def _within_budget(trials: Trials, candidates: list[Candidate]) -> list[Fidelity | None]:
    """The fidelity of the candidates in order, as many as the budget allows: a round of one
    candidate per worker at a time, the budget checked between rounds."""
    found: list[Fidelity | None] = []
    step = max(1, getattr(trials.executor, "workers", 1))
    while len(found) < len(candidates) and not trials.exhausted():
        room = trials.max_trials - trials.count
        found += trials.fidelity_many(candidates[len(found): len(found) + min(step, room)])
    return found


def _row(unit: Unit, base: Fidelity, kept: Fidelity | None, solo: Fidelity | None, units_float: int | None,
         precision: str) -> UnitSensitivity:
    """One unit's measures: losses in the metric's units, noise as shares of the model's."""
    def share(noise: float) -> float:
        return noise / base.noise if base.noise > 0 else 0.0

    return UnitSensitivity(
        node=unit.node, op_type=unit.op_type, nodes=list(unit.nodes), precision=precision, rank=None,
        alone_loss=None if solo is None else solo.drop,
        alone_noise=None if solo is None else share(solo.noise),
        float_gain=None if kept is None else base.drop - kept.drop,
        float_noise=None if kept is None else share(base.noise - kept.noise),
        float_units=units_float,
    )


def ranked(rows: list[UnitSensitivity]) -> list[UnitSensitivity]:
    """`rows` most sensitive first, with their ranks and rounded figures: the noise keeping a
    unit float removes, then the loss it removes, then its noise and loss alone, then its name;
    units not measured kept float come last, unranked, in their order.

    >>> a = UnitSensitivity("a", "MatMul", ["a"], "int8", None, 0.1, 0.5, 0.0, 0.2, 1)
    >>> b = UnitSensitivity("b", "MatMul", ["b"], "int8", None, 0.0, 0.1, 0.0, 0.2, 1)
    >>> c = UnitSensitivity("c", "Add", ["c"], "int8", None, None, None, None, None, None)
    >>> [(r.node, r.rank) for r in ranked([c, b, a])]
    [('a', 1), ('b', 2), ('c', None)]
    """
    def key(r: UnitSensitivity) -> tuple:
        return (-(r.float_noise or 0.0), -(r.float_gain or 0.0), -(r.alone_noise or 0.0), -(r.alone_loss or 0.0),
                r.node)

    measured = sorted((r for r in rows if r.float_gain is not None), key=key)
    out = []
    for k, r in enumerate(measured, start=1):
        out.append(UnitSensitivity(
            r.node, r.op_type, r.nodes, r.precision, k, rounded(r.alone_loss), rounded(r.alone_noise),
            rounded(r.float_gain), rounded(r.float_noise), r.float_units))
    return out + [r for r in rows if r.float_gain is None]
