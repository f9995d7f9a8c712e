"""The `qcli calibrate`, `qcli quantize` and `qcli analyze --sensitivity` flags as data, and their
rules: which flags conflict, which need which, and how they lay over the config. Each field is
the flag of the same name, so a Python caller gets the command line's behaviour and its errors
(QcliError, exit code 2) without the CLI; `qcli.commands` runs the commands with them.
"""

from __future__ import annotations

import os
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

from qcli.calibrate.table import CalibrationTable
from qcli.config import Config, load_config
from qcli.errors import QcliError
from qcli.executor import Executor, make_executor
from qcli.files import check_writable


@dataclass(frozen=True)
class CalibrationFlags:
    """`--config` and the flags laid over its calibration section (None: the config decides)."""

    config: str | None = None  # a YAML file or a preset name
    method: str | None = None
    percentile: float | None = None
    samples: int | None = None
    batch_size: int | None = None
    seq_len: int | None = None  # data.seq_len

    def load(self) -> Config:
        return self.merge(load_config(self.config))

    def merge(self, config: Config) -> Config:
        merged = config.merged(calibration={
            "method": self.method, "percentile": self.percentile, "samples": self.samples,
            "batch_size": self.batch_size,
        })
        return with_seq_len(merged, self.seq_len)


def with_seq_len(config: Config, seq_len: int | None) -> Config:
    """`config` with `--seq-len` laid over `data.seq_len` (None: as it is)."""
    if seq_len is None:
        return config
    if seq_len < 2:
        raise QcliError(f"--seq-len must be at least 2 tokens, got {seq_len}",
                        hint="a chunk's tokens are each predicted from those before it")
    return config.model_copy(update={"data": config.data.model_copy(update={"seq_len": seq_len})})


@dataclass(frozen=True)
class ScaleFlags:
    """Where calibration shards and search trials run: `--executor`, `--workers`, `--ray-address`."""

    executor: str = "local"  # local | ray
    workers: int | None = None
    ray_address: str | None = None

    @property
    def given(self) -> bool:
        return self.workers is not None or self.executor != "local" or self.ray_address is not None

    def make(self) -> closing[Executor]:
        """The executor these flags ask for (local: one worker by default: docs/guides/scale-out.md),
        closed after use."""
        workers = 1 if self.workers is None and self.executor == "local" else self.workers
        return closing(make_executor(self.executor, workers, self.ray_address))


@dataclass(frozen=True)
class SensitivityFlags:
    """`qcli analyze --sensitivity`, its budget (`--max-trials`, `--time-budget`: else the
    config's `auto_precision` keys, the precision search's) and where its trials run."""

    enabled: bool = False
    max_trials: int | None = None
    time_budget: float | None = None
    scale: ScaleFlags = field(default_factory=ScaleFlags)

    def check(self) -> None:
        if not self.enabled and (self.max_trials is not None or self.time_budget is not None or self.scale.given):
            raise QcliError("--max-trials, --time-budget, --executor, --workers and --ray-address go with "
                            "--sensitivity")

    def merge(self, config: Config) -> Config:
        return config.merged(auto_precision={"max_trials": self.max_trials, "time_budget": self.time_budget})


@dataclass(frozen=True)
class CalibrateFlags:
    """`qcli calibrate MODEL --data DIR`."""

    model: Path
    data: Path
    output: Path | None = None  # None: ./<model>.calib.json
    calibration: CalibrationFlags = field(default_factory=CalibrationFlags)
    strict: bool = False
    scale: ScaleFlags = field(default_factory=ScaleFlags)
    trt_cache: Path | None = None  # also TensorRT's calibration cache

    @property
    def calibration_file(self) -> Path:
        return self.output or Path.cwd() / f"{self.model.name.removesuffix('.onnx')}.calib.json"

    def check(self) -> None:
        """The calibration file (and the TensorRT cache) can be written (checked before the work)."""
        check_writable(self.calibration_file, "the calibration file")
        if self.trt_cache is not None:
            check_writable(self.trt_cache, "the TensorRT calibration cache")


@dataclass(frozen=True)
class QuantizeFlags:
    """`qcli quantize MODEL -o OUTPUT`: `check()` the flags, then take the `config()` they make."""

    model: Path
    output: Path
    data: Path | None = None  # calibrate on this folder, or
    calib: Path | None = None  # use this calibration file
    calibration: CalibrationFlags = field(default_factory=CalibrationFlags)
    strict: bool = False
    force: bool = False
    eval_data: Path | None = None
    max_accuracy_drop: float | None = None  # auto-precision's budget, else a gate on --eval-data
    auto_precision: bool = False
    criteria: str | None = None
    min_speedup: float | None = None
    max_size_mb: float | None = None
    max_trials: int | None = None
    time_budget: float | None = None
    precision_out: Path | None = None
    no_verify: bool = False
    no_rescue: bool = False
    min_top1_agreement: float | None = None
    min_cosine: float | None = None
    min_spatial_agreement: float | None = None
    max_latency_ratio: float | None = None
    scale: ScaleFlags = field(default_factory=ScaleFlags)

    def check(self) -> None:
        """The rules between flags that need no file read (the config may enable auto-precision:
        `config` checks the flags that depend on it); then that the outputs can be written."""
        if self.data is not None and self.calib is not None:  # neither: the plan must calibrate nothing (verify.py)
            raise QcliError("give exactly one of --data DIR (calibrate now) or --calib FILE")
        if self.calib is not None and not self.auto_precision and self.scale.given:
            raise QcliError("--executor, --workers and --ray-address apply to calibration and the precision "
                            "search: use them with --data or --auto-precision")
        if self.max_accuracy_drop is not None and self.eval_data is None and not self.auto_precision:
            raise QcliError("--max-accuracy-drop needs --eval-data DIR to measure the drop on")
        if self.output.exists() and self.model.exists() and os.path.samefile(self.output, self.model):
            raise QcliError(f"-o {self.output} is the input model; qcli never overwrites its input",
                            hint="write the quantized model to another file")
        check_writable(self.output, "the quantized model")
        if self.precision_out is not None:
            check_writable(self.precision_out, "the precision config")

    def config(self) -> Config:
        """The config file or preset with the flags laid over it."""
        config = self.calibration.load().merged(
            verify={
                "enabled": False if self.no_verify else None, "rescue": False if self.no_rescue else None,
                "min_top1_agreement": self.min_top1_agreement, "min_cosine": self.min_cosine,
                "min_spatial_agreement": self.min_spatial_agreement, "max_latency_ratio": self.max_latency_ratio,
            },
            auto_precision={
                "enabled": True if self.auto_precision else None, "criteria": self.criteria,
                "max_accuracy_drop": self.max_accuracy_drop if self.auto_precision else None,
                "min_speedup": self.min_speedup, "max_trials": self.max_trials, "time_budget": self.time_budget,
            },
        )
        if not config.auto_precision.enabled and (self.criteria or self.min_speedup or self.max_size_mb
                                                  or self.precision_out):
            raise QcliError("--criteria, --min-speedup, --max-size-mb and --precision-out go with --auto-precision")
        # after that check: a budget without int4 among the candidates is the config's error
        return config.merged(auto_precision={"max_size_mb": self.max_size_mb})

    def with_table(self, config: Config, table: CalibrationTable) -> Config:
        """`config` with the calibration file's own method, unless the flags or the config chose one."""
        flags = self.calibration
        chosen = load_config(flags.config).calibration.model_fields_set if flags.config else set()  # keys it sets
        return config.merged(calibration={
            "method": None if flags.method or "method" in chosen else table.settings.method,
            "percentile": None if flags.percentile or "percentile" in chosen else table.settings.percentile,
        })

    @property
    def needs_executor(self) -> bool:
        """Calibration or the precision search runs (an executor is only made for them)."""
        return self.data is not None or self.auto_precision
