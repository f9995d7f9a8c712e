"""`qcli run PIPELINE.yaml`: calibrate -> quantize -> analyze in one call, for CI.

The pipeline file's schema (`Pipeline`, validated like a config: strict keys, errors with
their line) lives here too. Paths in the pipeline file are relative to the file's folder. The steps are the library's
own (`quantize_checked`: calibrate, quantize, verify; then `analyze`); this module only wires
them and collects the results.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, field_validator

from qcli.analyze import Gates, Report, analyze, sample_count, write_report
from qcli.analyze.options import AnalyzeOptions
from qcli.calibrate.table import save_table, solved_methods
from qcli.calibrate.trtcache import write_trt_cache
from qcli.config import Config, Section, load_config, parse_config
from qcli.configerrors import config_error
from qcli.errors import ConfigError
from qcli.files import check_writable
from qcli.model import Owned, load_model, save_model
from qcli.phases import ProgressFactory, no_progress
from qcli.quantize import QuantizeResult
from qcli.target.deployment import Deployment
from qcli.verify import Outcome, quantize_checked
from qcli.yamlfile import read_yaml


class PipelineGates(Section):
    max_accuracy_drop: float | None = Field(None, ge=0, le=1, description=(
        "the largest accuracy drop, a fraction (0.01: one point of top-1); without labels, of 1 - top-1 "
        "agreement, 1 - cosine, or a regression's unexplained variance"))
    min_speedup: float | None = Field(None, gt=0, description=(
        "the least float / quantized latency: predicted by the config's target (the same on any CI runner), or "
        "timed with `verify.latency: measured`"))
    min_compression: float | None = Field(None, gt=0, description="the least float / quantized file size")


class Pipeline(Section):
    """`qcli run PIPELINE.yaml`: calibrate -> quantize -> analyze, paths relative to the file."""

    version: Literal[1] = Field(1, description="the schema version")
    model: str = Field(description="the float ONNX model")
    output: str = Field(description="the quantized model written")
    calibration_data: str = Field(description="the calibration data folder (any data-folder layout)")
    eval_data: str | None = Field(None, description="the data gates and reports are measured on (needed for them)")
    labels: str | None = Field(None, description="a `labels.csv` kept outside `eval_data`")
    config: str | dict | None = Field(None, json_schema_extra={"values": "a file, a preset name, or a mapping"},
                                      description="the config: a file, a preset name, or the config itself inline")
    calibration_file: str | None = Field(None, description="where to write the calibration file as well")
    trt_cache: str | None = Field(None, description=(
        "where to write TensorRT's calibration cache of the ranges as well (qcli.calibrate.trtcache)"))
    reports: list[str] = Field([], description="reports to write: `.json`, `.md` or `.html`")
    gates: PipelineGates = Field(PipelineGates(), description=(
        "Quality gates on the analysis of `eval_data`: one that fails exits 1 (the model and reports are still "
        "written)."))
    analyze: AnalyzeOptions = Field(AnalyzeOptions(), description=(
        "What the analysis measures and how long: the options of `qcli analyze` (one schema, `AnalyzeOptions`, "
        "also taken by `qcli.analyze.analyze` in Python)."))

    @field_validator("reports")
    @classmethod
    def _known_formats(cls, paths: list[str]) -> list[str]:
        for p in paths:
            if Path(p).suffix not in (".json", ".md", ".html"):
                raise ValueError(f"report {p!r} must end in .json, .md or .html")
        return paths


def load_pipeline(path: str | os.PathLike) -> tuple[Pipeline, Config]:
    """A pipeline file and the config it names (or holds), both validated."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"pipeline file not found: {path}")
    raw, lines = read_yaml(path, "pipeline file")
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: a pipeline is a mapping (model, output, calibration_data, ...)")
    try:
        pipeline = Pipeline.model_validate(raw)
    except ValidationError as exc:
        raise config_error(exc, raw, str(path), lines, schema=Pipeline) from None
    gates = any(v is not None for v in pipeline.gates.model_dump().values())
    measured = [key for key, given in (("reports", pipeline.reports), ("gates", gates)) if given]
    if measured and pipeline.eval_data is None:
        raise ConfigError(f"{path}:{lines[(measured[0],)]}: reports and gates need eval_data (the data to measure on)")
    base = path.parent
    if isinstance(pipeline.config, dict):
        sub = {k[1:]: v for k, v in lines.items() if k and k[0] == "config"}
        config = parse_config(pipeline.config, f"{path} (config)", sub)
    elif pipeline.config is not None:
        local = base / pipeline.config
        config = load_config(local if local.exists() else pipeline.config)
    else:
        config = Config()
    return pipeline, config


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
    check_outputs(pipeline, path)
    local = path.parent.joinpath

    def optional(p: str | None) -> Path | None:
        return None if p is None else local(p)

    model_path = local(pipeline.model)
    outcome = quantize_checked(
        Owned(load_model(model_path)), config, data=local(pipeline.calibration_data),
        eval_data=optional(pipeline.eval_data), labels=optional(pipeline.labels), progress=progress,
        methods=solved_methods(config.calibration.method),  # minmax (free) and the method used
    )
    calibration_file = None
    if pipeline.calibration_file:
        calibration_file = save_table(outcome.table, local(pipeline.calibration_file))
    if pipeline.trt_cache:
        write_trt_cache(outcome.table, local(pipeline.trt_cache))
    quantized = outcome.result
    output = save_model(quantized.model, local(pipeline.output), check=True)
    result = PipelineResult(output, quantized, outcome, outcome.config, calibration_file)
    if pipeline.eval_data is not None:
        eval_folder, options = local(pipeline.eval_data), pipeline.analyze
        total = sample_count(model_path, eval_folder, samples=options.samples, reading=config.data.reading)
        with progress("analyzing", total) as advance:
            result.report = analyze(
                model_path, output, eval_folder, options, labels=optional(pipeline.labels),
                gates=Gates(**pipeline.gates.model_dump()), reading=config.data.reading, progress=advance,
                verify=config.verify, deployment=Deployment.of(config),
            )
        for report_path in pipeline.reports:
            result.reports.append(write_report(result.report, local(report_path)))
    return result


def check_outputs(pipeline: Pipeline, path: Path) -> None:
    """What the pipeline file at `path` writes can be written, and is not its model (checked
    before the work)."""
    local = path.parent.joinpath
    output, model = local(pipeline.output), local(pipeline.model)
    if output.exists() and model.exists() and os.path.samefile(output, model):
        raise ConfigError(f"{path}: output {pipeline.output} is the model; qcli never overwrites its input",
                          hint="write the quantized model to another file")
    check_writable(output, "the quantized model")
    if pipeline.calibration_file:
        check_writable(local(pipeline.calibration_file), "the calibration file")
    if pipeline.trt_cache:
        check_writable(local(pipeline.trt_cache), "the TensorRT calibration cache")
    for report in pipeline.reports:
        check_writable(local(report), "the report")
