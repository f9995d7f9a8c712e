"""The `inspect`, `calibrate`, `quantize`, `analyze` and `run` commands as library calls: each
reads its inputs, runs, writes its files and returns the result with the document the CLI prints
(`--json`) and the error it exits with (`gate_error()`: a missed floor or gate, exit 1). Nothing
is printed.

    run = quantize_command(QuantizeFlags(Path("model.onnx"), Path("model.int8.onnx"), data=Path("calib")))
    print(run.doc["compression"]); error = run.gate_error()
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

from qcli import __version__
from qcli.analyze import FORMATS, AnalyzeOptions, Report, analyze, evaluate, headline, sample_count, write_report
from qcli.analyze.gates import Gates
from qcli.calibrate.table import METHODS, CalibrationTable, load_table, save_table, solved_methods
from qcli.calibrate.trtcache import write_trt_cache
from qcli.census import summary
from qcli.checks import Check
from qcli.config import PRESETS, config_yaml, load_config
from qcli.data import DataFolder, model_inputs
from qcli.errors import GateFailed, QcliError
from qcli.files import check_writable, write_text_atomic
from qcli.flags import CalibrateFlags, QuantizeFlags, SensitivityFlags, with_seq_len
from qcli.info import describe_data, describe_model, file_bytes
from qcli.model import Owned, fingerprint, load_model, save_model
from qcli.phases import ProgressFactory, no_progress, phase, recording
from qcli.pipeline import PipelineResult, run_pipeline
from qcli.quantize import calibrate
from qcli.target.deployment import Deployment
from qcli.verify import Outcome, quantize_checked

# --------------------------------------------------------------------------- inspect and calibrate


def inspect_command(model: Path, data: Path | None = None, *, config: str | None = None,
                    samples: int | None = None) -> dict:
    """A model's description, and its data folder's when `data` is given (checked against the
    model's inputs with the preprocessing of `config`)."""
    info = describe_model(model)
    if data is not None:
        inputs = model_inputs(load_model(model))
        folder = DataFolder(data, inputs, reading=load_config(config).data.reading, samples=samples)
        info["data"] = describe_data(folder)
    return info


def calibrate_command(flags: CalibrateFlags, *, progress: ProgressFactory = no_progress) -> dict:
    """Calibrate on `flags.data`: the statistics, and the ranges of minmax (free) and the
    selected method (`solved_methods`); write the calibration file (whose histograms let `quantize
    --calib FILE --method M` solve another method later); its document."""
    flags.check()
    config = flags.calibration.load()
    model = load_model(flags.model)
    folder = DataFolder(
        flags.data, model_inputs(model), reading=config.data.reading, samples=config.calibration.samples
    )
    out = flags.calibration_file
    start = time.perf_counter()
    with flags.scale.make() as pool, progress("calibrating", len(folder)) as advance:
        table = calibrate(model, folder, config, progress=advance, strict=flags.strict, executor=pool,
                          methods=solved_methods(config.calibration.method))
    save_table(table, out)
    doc = calibration_document(table, out, time.perf_counter() - start)
    if flags.trt_cache is not None:
        doc["trt_cache"] = str(write_trt_cache(table, flags.trt_cache))
    return doc


def calibration_document(table: CalibrationTable, path: Path, seconds: float) -> dict:
    return {
        "calibration_file": str(path),
        "samples": table.samples,
        "tensors": len(table.observers),
        "method": table.settings.method,
        "activations": f"{table.settings.dtype}{' symmetric' if table.settings.symmetric else ''}",
        "seconds": round(seconds, 3),
        "warnings": table.warnings,
        "ranges": {
            name: {
                "min": obs.min if obs.count else None,
                "max": obs.max if obs.count else None,
                **{m: list(table.ranges[m][name]) for m in METHODS if m in table.ranges},
                "clipped": table.clipped(name),
            }
            for name, obs in table.observers.items()
        },
    }


# --------------------------------------------------------------------------- quantize


@dataclass
class QuantizeRun:
    """What `qcli quantize` did: the document it prints, the verification and precision search
    (`outcome`), and the accuracy on `--eval-data` (`evaluation`)."""

    doc: dict
    outcome: Outcome
    output: Path
    evaluation: Report | None = None

    def gate_error(self) -> QcliError | None:
        """A missed verification floor or auto-precision goal, else a failed --eval-data gate."""
        error = outcome_error(self.outcome, self.output)
        if error is None and self.evaluation is not None:
            return self.evaluation.gate_error()
        return error


def quantize_command(flags: QuantizeFlags, *, progress: ProgressFactory = no_progress) -> QuantizeRun:
    """Calibrate (or read the calibration file), quantize, verify, write the model (and the
    precision config a search chose), and measure accuracy on `--eval-data`."""
    flags.check()
    with recording() as phases:
        run = _quantize_run(flags, progress)
    run.doc["phases"] = phases.to_dict()  # where the time went (qcli.phases)
    return run


def _quantize_run(flags: QuantizeFlags, progress: ProgressFactory) -> QuantizeRun:
    """`quantize_command` inside its phase record."""
    with phase("load"):
        model = load_model(flags.model)
    config = flags.config()
    table = None
    if flags.calib is not None:
        table = load_table(flags.calib, fingerprint(model))
        config = flags.with_table(config, table)
    handed = Owned(model)  # nothing else holds it: the verification frees its weights
    del model
    with flags.scale.make() if flags.needs_executor else nullcontext() as pool:
        outcome = quantize_checked(
            handed, config, data=flags.data, table=table, eval_data=flags.eval_data, force=flags.force,
            strict=flags.strict, progress=progress, executor=pool,
        )
    result = outcome.result
    with phase("write"):
        save_model(result.model, flags.output, check=True)
    doc = {
        "output": str(flags.output),
        "method": "run time (dynamic)" if result.plan.at_run_time and not result.plan.calibrated_tensors
        else config.calibration.method,
        "bytes_before": file_bytes(flags.model),
        "bytes_after": file_bytes(flags.output),
        **summary(result),
    }
    doc["compression"] = round(doc["bytes_before"] / max(doc["bytes_after"], 1), 3)
    doc["notes"] = doc["notes"] + outcome.notes
    doc["verification"] = outcome.verification.to_dict() if outcome.verification else None
    doc["precision"] = precision_document(outcome, write_precision_config(outcome, flags.output, flags.precision_out))
    run = QuantizeRun(doc, outcome, flags.output)
    if flags.eval_data is not None:
        with phase("evaluate"):
            run.evaluation = evaluate(
                flags.model, flags.output, flags.eval_data, max_accuracy_drop=flags.max_accuracy_drop,
                reading=config.data.reading, verify=config.verify,
            )
        doc["evaluation"] = {"summary": headline(run.evaluation), **run.evaluation.to_dict()}
    return run


def write_precision_config(outcome: Outcome, output: Path, precision_out: Path | None = None) -> Path | None:
    """Write the config that reproduces the model without searching, when a search ran and
    promoted units or wrote the model weight-only, auto-precision ran, or `precision_out` asks for
    it; its path."""
    if outcome.search is None or not (outcome.promoted or outcome.weight_only or outcome.searched_for_goal
                                      or precision_out is not None):
        return None
    path = precision_out or output.with_name(f"{output.name.removesuffix('.onnx')}.precision.yaml")
    header = (
        f"# qcli {__version__}: the precisions chosen for {output.name}.\n"
        f"# `qcli quantize MODEL --config {path.name} ...` (same data and calibration) reproduces it "
        "without searching.\n"
    )
    write_text_atomic(path, header + config_yaml(outcome.config))
    return path


def precision_document(outcome: Outcome, path: Path | None) -> dict | None:
    """The precision search for the summary (None: no search ran)."""
    found = outcome.search
    if found is None:
        return None
    return {
        "file": str(path) if path else None,
        "goal_met": found.met,
        "trials": found.trials,
        "stopped": found.stopped,
        "promoted": {n: {"precision": p, "reason": outcome.reasons.get(n, "")} for n, p in outcome.promoted.items()},
        "steps": [
            {"action": s.action, "changed": s.changed, "promoted": s.promoted, "drop": s.drop, "noise": s.noise,
             "latency_ratio": s.latency_ratio, "kept": s.kept, "quick": s.quick, "samples": s.samples}
            for s in found.steps
        ],
    }


def outcome_error(outcome: Outcome, output: Path) -> GateFailed | None:
    """GateFailed (exit 1) when verification missed a floor or auto-precision its goal."""
    cfg = outcome.config
    if outcome.verification is not None and not outcome.verification.passed:
        missed = [c for c in outcome.verification.checks if not c.passed]
        return GateFailed(
            "verification failed: " + "; ".join(c.missed for c in missed) + f" (wrote the best model found: {output})",
            hint=_what_to_try(outcome, missed),
        )
    if outcome.search is not None and outcome.searched_for_goal and not outcome.goal_met:
        ap = cfg.auto_precision
        size = f", max size {ap.max_size_mb:g} MB" if ap.max_size_mb is not None else ""
        return GateFailed(
            f"auto-precision could not meet its goal ({ap.criteria}, max accuracy drop {ap.max_accuracy_drop:g}"
            f"{size}); wrote the best model found: {output}",
            hint="raise --max-accuracy-drop" + (" or --max-size-mb" if size else "")
            + ", add candidates (int16, float), or raise --max-trials/--time-budget",
        )
    return None


def _what_to_try(outcome: Outcome, missed: list[Check]) -> str:
    names = {c.name for c in missed}
    tips = []
    if names - {"latency ratio", "memory reduction"}:  # an accuracy figure (any output kind's, verify.metric's)
        tips.append("exclude or promote the sensitive layers in a --config (see the layer table of qcli analyze)")
        if not outcome.config.verify.rescue:
            tips.append("drop --no-rescue to let qcli search")
        elif outcome.search is not None and outcome.search.stopped:
            tips.append("give the rescue more room (verify.max_trials)")
    if "latency ratio" in names:
        tips.append("raise --max-latency-ratio, or keep the model float if int8 does not pay off here")
    if "memory reduction" in names:
        tips.append("store more weights in fewer bits (int4 blocks: weights.dtype, a preset such as weights-int4), "
                    "or lower verify.min_memory_reduction")
    tips.append("--no-verify skips the check")
    return "; ".join(tips)


# --------------------------------------------------------------------------- analyze and run


def analyze_command(
    float_model: Path,
    quantized_model: Path,
    data: Path,
    options: AnalyzeOptions,
    *,
    labels: Path | None = None,
    gates: Gates = Gates(),
    config: str | None = None,
    report: Path | None = None,
    seq_len: int | None = None,
    progress: ProgressFactory = no_progress,
    sensitivity: SensitivityFlags | None = None,
) -> Report:
    """`analyze` with the data reading of `config` (a file or preset; `seq_len` over its
    `data.seq_len`), writing `report` when
    given (.json, .md or .html); with `sensitivity.enabled`, each unit's sensitivity too
    (qcli.precision.sensitivity; QUANTIZED's metadata is checked before any work). The caller
    checks `gate_error()`."""
    sensitivity = sensitivity or SensitivityFlags()
    sensitivity.check()
    if report is not None:
        check_report(report)
    loaded = with_seq_len(load_config(config), seq_len)
    if sensitivity.enabled:
        from qcli.precision.sensitivity import read_recipe

        models = load_model(float_model), load_model(quantized_model)
        recipe = read_recipe(models[1], str(quantized_model), models[0])
    reading = loaded.data.reading
    total = sample_count(float_model, data, samples=options.samples, reading=reading)
    with progress("analyzing", total) as advance:
        result = analyze(
            float_model, quantized_model, data, options, labels=labels, gates=gates, reading=reading,
            progress=advance, verify=loaded.verify, deployment=Deployment.of(loaded),
        )
    if sensitivity.enabled:
        from qcli.precision.sensitivity import measure_sensitivity

        with sensitivity.scale.make() as pool:
            result.sensitivity = measure_sensitivity(
                *models, data, sensitivity.merge(loaded), label=str(quantized_model), progress=progress,
                executor=pool, recipe=recipe,
            )
    if report is not None:
        write_report(result, report)
    return result


def check_report(path: Path) -> Path:
    """`path` names a format qcli writes and can be written (checked before the work)."""
    if path.suffix.lower() not in FORMATS:
        raise QcliError(f"cannot write a report as {path.suffix or 'a file without extension'!r}",
                        hint="name the report file .json, .md or .html")
    return check_writable(path, "the report")


@dataclass
class PipelineRun:
    """What `qcli run` did: the pipeline's result and the document it prints."""

    result: PipelineResult
    doc: dict

    def gate_error(self) -> QcliError | None:
        """A missed verification floor or auto-precision goal, else a failed gate of the analysis."""
        result = self.result
        error = outcome_error(result.outcome, result.output)
        if error is None and result.report is not None:
            return result.report.gate_error()
        return error


def run_command(path: Path, *, progress: ProgressFactory = no_progress) -> PipelineRun:
    """Run the pipeline file at `path` and write the precision config a search chose."""
    result = run_pipeline(path, progress=progress)
    outcome = result.outcome
    precision = precision_document(outcome, write_precision_config(outcome, result.output))
    doc = {
        "output": str(result.output),
        "calibration_file": str(result.calibration_file) if result.calibration_file else None,
        "quantization": summary(result.quantized),
        "verification": outcome.verification.to_dict() if outcome.verification else None,
        "precision": precision,
        "reports": [str(p) for p in result.reports],
        "analysis": result.report.to_dict() if result.report else None,
    }
    return PipelineRun(result, doc)


def init_config(output: Path, force: bool = False) -> Path:
    """`qcli config init`: the default preset, commented, written to `output` to start from."""
    if output.exists() and not force:
        raise QcliError(f"{output} exists", hint="choose another path with -o, or --force to overwrite")
    return write_text_atomic(check_writable(output, "the config template"), (PRESETS / "default.yaml").read_text())


def measure_target(output: Path | None, threads: int | None, name: str | None, batch: int = 1, *,
                   progress: ProgressFactory = no_progress) -> dict:
    """`qcli target measure`: this machine's profile at `batch`, written atomically; what was
    written."""
    from qcli.target.measure import ROUNDS, dump, measure, suite_size

    start = time.perf_counter()
    models = suite_size()
    with progress("measuring kernels", models * ROUNDS, unit="models") as advance:
        profile = measure(threads, advance, name, batch)
    path = output if output is not None else Path(f"{profile.name}.json")
    write_text_atomic(check_writable(path, "the target profile"), dump(profile))
    return {"path": str(path), "name": profile.name, "entries": len(profile.kernels), "models": models,
            "seconds": round(time.perf_counter() - start, 1), "threads": profile.threads, "batch": profile.batch}


def calibrate_target(model: Path, data: Path | None, output: Path | None, base: str = "auto",
                     config: str | None = None, name: str | None = None, *,
                     progress: ProgressFactory = no_progress) -> dict:
    """`qcli target measure --model`: `base` calibrated on `model` and the model `config`
    writes from it with verification off, both timed here on `data`'s first sample at the
    config's `target.batch` (qcli.target.calibrated), written atomically to `output` (default
    ./MODEL.target.json); what was written."""
    from qcli.analyze.latency import timed_inputs
    from qcli.target.calibrated import PAIRS, calibrate
    from qcli.target.measure import dump
    from qcli.target.profile import resolve

    start = time.perf_counter()
    if data is None:
        raise QcliError("--model needs --data DIR: the int8 model is calibrated on it and its first sample timed")
    output = check_writable(output or Path(f"{model.stem}.target.json"), "the target profile")
    profile, _ = resolve(base)
    given = load_model(model)
    cfg = load_config(config).merged(verify={"enabled": False}, auto_precision={"enabled": False},
                                     calibration={"samples": 16})  # ranges do not change which kernels run
    with progress("quantizing (all int8)", 1) as advance:
        int8 = quantize_checked(given, cfg, data=data).result.model  # not handed over: `given` is timed too
        advance(1)
    specs = model_inputs(given)
    first = next(iter(DataFolder(data, specs, reading=cfg.data.reading).batches(1)))
    feeds, batch = timed_inputs(first, specs, cfg.target.batch)
    with progress("timing the file and its all-int8 model", PAIRS, unit="session pairs") as advance:
        found = calibrate(profile, given, int8, feeds, name or f"{profile.name}+{model.stem}", model.name, advance,
                          cfg.target.threads, batch)
    write_text_atomic(output, dump(found))
    assert found.calibration is not None
    c = found.calibration
    said = (f"{found.name}, float kernels x{c.factors['float']:g}, int8 kernels x{c.factors['int8']:g} ({c.model} "
            f"timed {c.measured_ms['float']:g} ms, all int8 {c.measured_ms['int8']:g} ms)")
    said += f"; {c.note}" if c.note else ""
    return {"path": str(output), "name": found.name, **c.model_dump(), "said": said,
            "seconds": round(time.perf_counter() - start, 1)}
