"""`qcli run PIPELINE.yaml`: calibrate -> quantize -> analyze in one call, for CI.

Paths in the pipeline file are relative to the file's folder. The steps are the library's
own (`quantize_checked`: calibrate, quantize, verify; then `analyze`); this module only wires
them and collects the results.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from qcli.analyze import Gates, Report, analyze, sample_count, write_report
from qcli.calibrate.table import METHODS, save_table
from qcli.config import Config, load_pipeline
from qcli.model import load_model, save_model
from qcli.quantize import QuantizeResult
from qcli.verify import Outcome, ProgressFactory, no_progress, quantize_checked


@dataclass
class PipelineResult:
    output: Path
    quantized: QuantizeResult
    outcome: Outcome  # verification and precision search
    config: Config  # reproduces the model: the pipeline's config plus the promotions
    calibration_file: Path | None = None
    report: Report | None = None
    reports: list[Path] = field(default_factory=list)


def run_pipeline(path: str | Path, *, progress: ProgressFactory = no_progress) -> PipelineResult:
    """Run the pipeline file at `path`; the caller checks `result.report.gate_error()`."""
    path = Path(path)
    pipeline, config = load_pipeline(path)
    local = path.parent.joinpath

    def optional(p: str | None) -> Path | None:
        return None if p is None else local(p)

    model_path = local(pipeline.model)
    outcome = quantize_checked(
        load_model(model_path), config, data=local(pipeline.calibration_data), eval_data=optional(pipeline.eval_data),
        labels=optional(pipeline.labels), progress=progress,
        methods=METHODS if pipeline.calibration_file else None,  # the file keeps every method
    )
    calibration_file = None
    if pipeline.calibration_file:
        calibration_file = save_table(outcome.table, local(pipeline.calibration_file))
    quantized = outcome.result
    output = save_model(quantized.model, local(pipeline.output), check=True)
    result = PipelineResult(output, quantized, outcome, outcome.config, calibration_file)
    if pipeline.eval_data is not None:
        eval_folder, options = local(pipeline.eval_data), pipeline.analyze
        total = sample_count(model_path, eval_folder, samples=options.samples, preprocess=config.data.preprocess)
        with progress("analyzing", total) as advance:
            result.report = analyze(
                model_path, output, eval_folder, options, labels=optional(pipeline.labels),
                gates=Gates(**pipeline.gates.model_dump()), preprocess=config.data.preprocess, progress=advance,
            )
        for report_path in pipeline.reports:
            result.reports.append(write_report(result.report, local(report_path)))
    elif pipeline.reports or any(v is not None for v in pipeline.gates.model_dump().values()):
        from qcli.errors import ConfigError

        raise ConfigError(f"{path}: reports and gates need eval_data (the data to measure on)")
    return result
