"""Which samples verification compares, and which calibration reads (docs/guides/verification.md),
decided once by `plan_data` and stated in the summary:
- `--eval-data`: its first `verify.samples` (auto-precision: `auto_precision.samples`);
- else the samples of `--data` after the ones calibration reads, when there are at least
  MIN_SAMPLES of them;
- else the last eighth of `--data` (at most `verify.samples`) is held back from calibration,
  when that is at least MIN_SAMPLES;
- else (a folder too small to split) k-fold over the calibration samples (`verify.folds`,
  `fold_plan`): one calibration pass keeps each fold's statistics (`calibrate(..., folds=)`),
  every candidate is built once per fold from the other folds' table and each fold's samples
  are run on their own fold's model (Probe.folds), so nothing compared was calibrated on; the
  model written is calibrated on every sample; `verify.folds: 1`: the calibration samples
  themselves, and the summary says so;
- with `--calib` and no `--eval-data` there is nothing to compare on: verification is skipped,
  with a note; so it is with neither `--data` nor `--calib`, which a config that calibrates
  nothing (every quantized node dynamic, or weights only) allows.
`calibrate_planned` calibrates on the samples a plan gives calibration, in its folds.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnx

from qcli.analyze.latency import timed_inputs
from qcli.analyze.probe import Probe
from qcli.analyze.spilled import HeldBatches
from qcli.calibrate.shards import Fold, plan_folds
from qcli.calibrate.table import CalibrationTable
from qcli.config import Config
from qcli.data import DataFolder, InputSpec, model_inputs
from qcli.phases import ProgressFactory, no_progress
from qcli.prepare import PrepareResult
from qcli.prepare.shapes import batch_within
from qcli.quantize import (
    calibrate,
    fold_grams,
    gptq_weights,
    gram_passes,
    hqq_weights,
    measure_bias_shifts,
    measure_grams,
    round_gptq,
    round_hqq,
)
from qcli.target.deployment import Deployment

MIN_SAMPLES = 16
PROBE_BATCH = 32  # samples per probe batch, at most (fewer where a sample is large: `batch_within`)


@dataclass(frozen=True)
class DataPlan:
    calibration_samples: int | None  # first N of --data calibration reads (None: no --data)
    verify_path: Path | None  # None: nothing to compare on
    verify_start: int = 0
    verify_count: int = 0
    description: str = ""
    folds: int = 1  # > 1: k-fold over the calibration samples (`fold_plan` settles it)
    spans: tuple[tuple[int, int], ...] = ()  # k-fold: (first, count) compared per fold

    @property
    def compared(self) -> tuple[tuple[int, int], ...]:
        """(first sample, count) of each run of samples compared (one per fold when folded)."""
        return self.spans or ((self.verify_start, self.verify_count),)


def plan_data(data: Path | None, data_total: int | None, eval_data: Path | None, config: Config,
              count: int) -> DataPlan:
    """Which samples calibration reads and which verification compares (module docstring)."""
    wanted = config.calibration.samples
    if eval_data is not None:
        return DataPlan(wanted, eval_data, 0, count, f"{eval_data} (first {count} samples at most)")
    if data is None or data_total is None:
        return DataPlan(None, None, description="no data to compare on: give --eval-data DIR")
    n = data_total
    calibration = min(wanted, n)
    spare = n - calibration
    if spare >= MIN_SAMPLES:
        take = min(spare, count)
        return DataPlan(calibration, data, calibration, take,
                        f"{data} samples {calibration + 1}-{calibration + take} (not used by calibration)")
    held = min(count, n // 8)
    if held >= MIN_SAMPLES:
        calibration = min(wanted, n - held)
        return DataPlan(calibration, data, n - held, held,
                        f"{data} samples {n - held + 1}-{n} (held back from calibration, which reads {calibration})")
    take = min(n, count)
    folds = min(config.verify.folds, calibration)
    return DataPlan(calibration, data, 0, take,
                    f"{data} samples 1-{take}: also calibration samples (the folder is too small to hold "
                    f"{MIN_SAMPLES} back; give --eval-data for an independent check)", folds if folds > 1 else 1)


def fold_plan(plan: DataPlan, samples: int, batch_size: int) -> tuple[DataPlan, list[Fold]]:
    """The folds of a k-fold plan over the `samples` calibration reads (`plan_folds`), each
    compared on up to its share of `verify_count`; none when the plan has no folds."""
    if plan.folds < 2:
        return plan, []
    folds = plan_folds(samples, plan.folds, batch_size)
    n, k = samples, len(folds)
    each = n if plan.verify_count >= n else -(-plan.verify_count // k)
    spans = tuple((f.first, min(f.samples, each)) for f in folds)
    compared = sum(count for _, count in spans)
    why = (f"{plan.verify_path} samples 1-{n} in {k} folds: {compared} compared, each fold on a model calibrated "
           f"on the other {k - 1} folds (at least {n - max(f.samples for f in folds)} samples); the model written "
           f"is calibrated on all {n} (the folder is too small to hold {MIN_SAMPLES} back)")
    return replace(plan, folds=k, verify_count=compared, description=why, spans=spans), folds


def plan_samples(data: Path | None, eval_data: Path | None, config: Config, inputs: list[InputSpec]) -> DataPlan:
    """`plan_data` for this run: what calibration reads, and what the checks compare (when on)."""
    ap, vf = config.auto_precision, config.verify
    if not (ap.enabled or vf.enabled):
        return DataPlan(config.calibration.samples, None)
    total = len(DataFolder(data, inputs, reading=config.data.reading)) if data is not None else None
    return plan_data(data, total, eval_data, config, ap.samples if ap.enabled else vf.samples)


def make_probe(model: onnx.ModelProto, inputs: list[InputSpec], config: Config, plan: DataPlan,
           labels: Path | None) -> Probe:
    """The probe comparing candidates with the float model on the samples `plan` holds back;
    k-fold: each fold's share, its batches tagged with the fold."""
    assert plan.verify_path is not None  # checked by the caller
    batches, tags = HeldBatches(), []  # inputs past INPUTS_HELD_BYTES read from a temporary folder
    size = None
    for k, (start, count) in enumerate(plan.compared):
        folder = DataFolder(plan.verify_path, inputs, reading=config.data.reading, samples=count, start=start,
                            labels=labels)
        size = size or batch_within(model, folder, PROBE_BATCH)
        for batch in folder.batches(size):
            batches.append(batch)
            tags.append(k)
    return Probe(model, batches, inputs, source=plan.description, verify=config.verify,
                 deployment=Deployment.of(config),
                 folds=tags if plan.spans else None)


def deployment_feeds(model: onnx.ModelProto, plan: DataPlan, inputs: list[InputSpec],
                     config: Config) -> dict[str, np.ndarray]:
    """The probe's first batch at `target.batch` (`timed_inputs`): the prompt of what it
    predicts latency on (qcli.analyze.predicted.served)."""
    assert plan.verify_path is not None  # checked by the caller
    start, count = plan.compared[0]
    folder = DataFolder(plan.verify_path, inputs, reading=config.data.reading, samples=count or None,
                        start=start)
    first = next(iter(folder.batches(batch_within(model, folder, PROBE_BATCH))))
    feeds, _ = timed_inputs(first, inputs, config.target.batch)
    return feeds


def calibrate_planned(model: onnx.ModelProto, config: Config, data: Path, plan: DataPlan,
                      prepared: PrepareResult, *, progress: ProgressFactory = no_progress, executor=None,
                      methods: tuple[str, ...] | None = None, force: bool = False,
                      strict: bool = False) -> tuple[DataPlan, CalibrationTable]:
    """Calibrate on the samples of `data` that `plan` gives calibration, in folds when `plan`
    compares on them (`fold_plan`), then bias correction's shifts when it is on: on every sample
    for the model written, and for each fold's model on the other folds' samples alone, as its
    ranges; the plan as the folds left it, and the table."""
    folder = DataFolder(data, model_inputs(model), reading=config.data.reading,
                        samples=plan.calibration_samples)
    plan, folds = fold_plan(plan, len(folder), config.calibration.batch_size)
    with progress("calibrating", len(folder)) as advance:
        table = calibrate(model, folder, config, progress=advance, force=force, strict=strict,
                          methods=methods or (config.calibration.method,), prepared=prepared,
                          executor=executor, folds=folds)
    parts = [[folder], *(_other_folds(folder, fold) for fold in folds)]
    algorithm = config.weights.algorithm
    by = "gptq" if algorithm == "gptq" else ", ".join(config.recovery.rounding)
    if by:  # one pass for every fold: a fold's model sums the other folds' (qcli.gptq.summed)
        with progress(f"measuring Gram matrices ({by})", len(folder) * gram_passes(config, prepared)) as advance:
            each = [[folder.window(f.first, f.samples)] for f in folds] or [[folder]]
            table.grams, fold_parts = fold_grams(config, each, prepared=prepared, progress=advance)
            for t, grams in zip(table.folds, fold_parts, strict=True):
                t.grams = grams
    if algorithm == "awq":
        with progress("measuring Gram matrices and |x| (awq)", len(folder) * len(parts) - sum(f.samples for f in folds)
                      ) as advance:
            for t, part in zip([table, *table.folds], parts, strict=True):
                measure_grams(model, config, t, part, prepared=prepared, progress=advance)
    if by:
        weights = gptq_weights(config, prepared)
        with progress(f"rounding weights ({by})", weights * (1 + len(table.folds)), unit="weights") as advance:
            for t in [table, *table.folds]:
                round_gptq(config, t, prepared=prepared, progress=advance)
    if algorithm == "hqq":
        with progress("rounding weights (hqq)", hqq_weights(config, prepared), unit="weights") as advance:
            round_hqq(config, prepared=prepared, progress=advance)
    if config.recovery.bias_correction is not None:
        with progress("measuring bias shifts", len(folder) * len(parts) - sum(f.samples for f in folds)) as advance:
            for t, part in zip([table, *table.folds], parts, strict=True):
                measure_bias_shifts(model, config, t, part, prepared=prepared, progress=advance)
    return plan, table


def _other_folds(folder: DataFolder, fold: Fold) -> list[DataFolder]:
    """The samples of `folder` outside `fold` (those its fold's table was calibrated on)."""
    after = fold.first + fold.samples
    return [folder.window(first, count) for first, count in ((0, fold.first), (after, len(folder) - after))
            if count > 0]
