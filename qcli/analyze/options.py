"""The options of `qcli analyze` (flags, and a pipeline file's `analyze:` section): one schema
for both, validated like the YAML config (qcli/config.py)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, ValidationError

from qcli.config import Section
from qcli.configerrors import key_path
from qcli.errors import ConfigError


class AnalyzeOptions(Section):
    """What `qcli.analyze.analyze` measures and how long: the `analyze:` section of a pipeline
    file and the `qcli analyze` flags both build it. `samples`: the first N (None: all); `runs`
    timed runs per model (0: no latency) after `warmup` untimed ones, on `latency_batch` samples
    with `threads` intra-op threads (None: onnxruntime's default); `worst` layers listed in the
    reports; `layers=False` skips the per-layer pass."""

    # the title names it in errors
    samples: int | None = Field(None, ge=1, title="the number of samples", description=(
        "the first N samples of the data (`null`: all)"))
    batch_size: int = Field(32, ge=1, description="samples per inference batch, at most: fewer when one run's "
                            "intermediate tensors would pass 64 MB (a note says so)")
    runs: int = Field(50, ge=0, description="timed runs per model, alternating between them (0: no timing)")
    warmup: int = Field(5, ge=0, description="untimed runs first")
    # onnxruntime takes a 32-bit count
    threads: int | None = Field(None, ge=1, le=1024, description="intra-op threads (`null`: onnxruntime's default)")
    latency_batch: int = Field(1, ge=1, description="the batch timed")
    worst: int = Field(10, ge=0, description="the worst layers (per-layer SQNR) listed in the reports")
    layers: bool = Field(True, description="`false`: skip the per-layer pass")

    @classmethod
    def of(cls, base: AnalyzeOptions | None = None, /, **values: Any) -> AnalyzeOptions:
        """`base` (None: the defaults) with `values` laid over it, validated; a bad value is a
        ConfigError for Python callers and flags ("batch_size must be at least 1, got 0")."""
        unknown = sorted(set(values) - set(cls.model_fields))
        if unknown:
            raise TypeError(f"unknown analyze option(s): {', '.join(unknown)}")
        try:
            return cls.model_validate({**(base.model_dump() if base else {}), **values})
        except ValidationError as exc:
            first = exc.errors()[0]
            key = key_path(first["loc"])
            if first["type"] == "greater_than_equal":
                name = cls.model_fields[key].title or key
                raise ConfigError(f"{name} must be at least {first['ctx']['ge']}, got {first['input']}") from None
            raise ConfigError(f"{key}: {first['msg']}") from None
