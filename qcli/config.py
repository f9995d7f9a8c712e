"""The YAML configuration (DESIGN.md §3): one typed schema, validated once at the edge.

`load_config(path)` parses a file and returns a frozen `Config`; errors name the file, the line
and the key path (`calibration.percentile`), with a did-you-mean for unknown keys. Command-line
flags are merged on top with `Config.merged(...)`, validated by the same schema. Nothing
downstream reads raw dicts. Validation uses pydantic (models with `extra="forbid"`): a
well-kept library that reports every error with its location, which we map to YAML lines.
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from qcli.configerrors import config_error, key_path
from qcli.data import Preprocess
from qcli.errors import ConfigError
from qcli.yamlfile import read_yaml

Method = Literal["minmax", "percentile", "kl", "mse"]
ActivationDtype = Literal["uint8", "int8", "uint16", "int16", "float8e4m3fn", "float8e5m2", "float"]  # float: w-only
WeightDtype = Literal["int8", "uint8", "int16", "int4", "uint4", "float8e4m3fn", "float8e5m2"]  # int16: w-only
FLOAT8 = ("float8e4m3fn", "float8e5m2")  # FP8: symmetric only (zero point 0), opset 19
GranularityName = Literal["per_tensor", "per_channel", "per_block"]  # the core types it: scheme.granularity_of
Criterion = Literal["performance", "balanced", "accuracy", "custom"]
# dynamic: run-time activation scales; float16/bfloat16: run in that type, unquantized
Precision = Literal["float", "int8", "uint8", "int16", "uint16", "dynamic", "float16", "bfloat16"]
HALF_PRECISIONS = ("float16", "bfloat16")  # float nodes run in a 16-bit float type (qcli/half.py)
NO_QDQ = ("float", "dynamic", *HALF_PRECISIONS)  # precisions whose nodes get no static Q/DQ pair
Mode = Literal["static", "dynamic"]
OutputKindName = Literal["top1", "sequence", "cosine", "mask", "per_element", "ignore"]  # qcli.analyze.kinds.Kind
# int4: weights, to shrink; float16/bfloat16: the node in that type (one of them per model)
Candidate = Literal["float", "int8", "uint8", "int16", "uint16", "int4", "dynamic", "float16", "bfloat16"]


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # .nan/.inf: no setting means them


class Calibration(Section):
    method: Method = "mse"
    percentile: float = Field(99.999, gt=50, le=100)
    samples: int = Field(256, ge=1)
    batch_size: int = Field(8, ge=1)
    bins: int = Field(2048, ge=128, le=1 << 16)


class Activations(Section):
    """`mode: dynamic` quantizes activations at run time (README "Dynamic quantization"): to
    uint8 with an asymmetric range per tensor, which is what onnxruntime's DynamicQuantizeLinear
    computes, so other dtypes and `symmetric` cannot go with it."""

    dtype: ActivationDtype = "uint8"
    symmetric: bool = False
    mode: Mode = "static"

    @field_validator("mode")
    @classmethod
    def _dynamic_is_uint8(cls, mode: str, info: ValidationInfo) -> str:
        if mode == "dynamic":
            dtype, symmetric = info.data.get("dtype", "uint8"), info.data.get("symmetric", False)
            if dtype != "uint8" or symmetric:
                given = f"dtype {dtype}" + (" symmetric" if symmetric else "")
                raise ValueError(f"dynamic quantizes activations to uint8 asymmetric at run time (onnxruntime's "
                                 f"DynamicQuantizeLinear): not with {given}")
        return mode

    @model_validator(mode="after")
    def _float8_is_symmetric(self) -> Activations:
        check_float8(self.dtype, self.symmetric)
        return self


class Weights(Section):
    dtype: WeightDtype = "int8"
    symmetric: bool = True
    granularity: GranularityName = "per_channel"
    block_size: int = Field(32, ge=8, le=1 << 16)  # larger than any weight's axis: one block per channel

    @field_validator("block_size")
    @classmethod
    def _power_of_two(cls, v: int) -> int:
        if v & (v - 1):
            raise ValueError(f"block_size must be a power of two, got {v}")
        return v

    @model_validator(mode="after")
    def _float8_is_symmetric(self) -> Weights:
        if self.dtype in (*FLOAT8, "int16") and self.granularity == "per_block":
            raise ValueError(f"{self.dtype} weights are per channel or per tensor, not per block")
        check_float8(self.dtype, self.symmetric)
        return self


def check_float8(dtype: str, symmetric: bool) -> None:
    """A float8 scheme is symmetric: its zero point is 0 (scale = range / the type's largest)."""
    if dtype in FLOAT8 and not symmetric:
        raise ValueError(f"{dtype} is symmetric only (zero point 0): set symmetric: true")


class Match(Section):
    """Selects nodes (by name pattern AND op type when both are given) and tensors by name.
    Patterns are globs (`/encoder/*`) or `re:<regex>` (full match)."""

    nodes: list[str] = []
    op_types: list[str] = []
    tensors: list[str] = []

    @field_validator("nodes", "tensors")
    @classmethod
    def _regexes_compile(cls, patterns: list[str]) -> list[str]:
        for p in patterns:
            if p.startswith("re:"):
                try:
                    re.compile(p[3:])
                except re.error as exc:
                    raise ValueError(f"regular expression {p[3:]!r} does not compile: {exc}") from None
        return patterns


class CalibrationOverride(Section):
    method: Method | None = None
    percentile: float | None = Field(None, gt=50, le=100)


class Override(Section):
    match: Match

    @field_validator("match")
    @classmethod
    def _selects_something(cls, m: Match) -> Match:
        if not (m.nodes or m.op_types or m.tensors):
            raise ValueError("match needs at least one of nodes, op_types, tensors")
        return m

    precision: Precision | None = None
    activations: Activations | None = None
    weights: Weights | None = None
    calibration: CalibrationOverride | None = None
    range: tuple[float, float] | None = None

    @model_validator(mode="after")
    def _dynamic_selects_nodes(self) -> Override:
        dynamic = self.precision == "dynamic"
        if self.precision in ("dynamic", *HALF_PRECISIONS) and not (self.match.nodes or self.match.op_types):
            raise ValueError(f"precision {self.precision} applies to nodes: give match.nodes or match.op_types")
        if self.precision in HALF_PRECISIONS and (self.activations or self.weights):
            raise ValueError(f"precision {self.precision} runs the nodes in {self.precision}, unquantized: "
                             "drop activations and weights here")
        if dynamic and self.activations is not None:
            raise ValueError("precision dynamic sets the activations (uint8 at run time): drop activations here")
        made_dynamic = dynamic or (self.activations is not None and self.activations.mode == "dynamic")
        if self.weights is not None and made_dynamic:
            check_dynamic_weights(self.weights)
        return self

    @field_validator("range")
    @classmethod
    def _low_high(cls, r: tuple[float, float] | None) -> tuple[float, float] | None:
        if r is not None and r[0] > r[1]:
            raise ValueError("the range is reversed (low above high): write [low, high]")
        return r


def check_dynamic_weights(w: Weights) -> Weights:
    """Weights of dynamic nodes: 8 bits, per channel or per tensor (the integer matmul kernels
    onnxruntime runs at run time take one scale per output channel)."""
    if w.dtype not in ("int8", "uint8") or w.granularity == "per_block":
        raise ValueError(f"dynamic quantization takes 8-bit weights per channel or per tensor, not "
                         f"{w.dtype} {w.granularity} (activations.mode is dynamic)")
    return w


RECOVERY_STEPS = ("smoothquant", "bias_correction", "equalization")


class SmoothQuant(Section):
    """Per-input-channel scales that move activation outliers into the weights of MatMul/Gemm
    and 1x1 Conv (README "Recovery"). `alpha`: the share of the outlier moved (0: none, 1: all),
    or `auto`: chosen per layer by measured error."""

    alpha: float | Literal["auto"] = "auto"
    op_types: list[Literal["MatMul", "Gemm", "Conv"]] = ["MatMul", "Gemm", "Conv"]

    @field_validator("alpha")
    @classmethod
    def _share(cls, alpha: float | str) -> float | str:
        if not isinstance(alpha, str) and not 0.0 <= alpha <= 1.0:
            raise ValueError("alpha is a share between 0 and 1, or auto")
        return alpha


class BiasCorrection(Section):
    """Empirical bias correction (README "Recovery"): the mean output shift int8 causes in each
    quantized node of these types, measured on the calibration data, taken out of its bias."""

    op_types: list[Literal["Conv", "ConvTranspose", "Gemm", "MatMul"]] = ["Conv", "Gemm", "MatMul"]


class Equalization(Section):
    """Cross-layer equalization of Conv -> (Relu/Clip) -> Conv pairs, depthwise included (README
    "Recovery"): per-channel weight ranges balanced across each pair before calibration."""

    iterations: int = Field(1, ge=1, le=100)  # passes over the chains (each balances every pair once)


class Recovery(Section):
    """The `recovery:` steps, each absent (off) or with its knobs. Written in YAML as a list of
    step names or one-key mappings (`[smoothquant, {equalization: {iterations: 2}}]`) or as a
    mapping; the order they run in is fixed (equalization, smoothquant, bias correction), not
    the list's."""

    smoothquant: SmoothQuant | None = None
    bias_correction: BiasCorrection | None = None
    equalization: Equalization | None = None

    @model_validator(mode="before")
    @classmethod
    def _steps(cls, raw: Any) -> Any:
        if raw is None:
            return {}
        if isinstance(raw, dict):
            raw = {k: ({} if v is None else v) for k, v in raw.items()}
            return raw
        if not isinstance(raw, list):
            return raw
        steps: dict[str, Any] = {}
        for item in raw:
            name, knobs = (item, {}) if isinstance(item, str) else next(iter(item.items()), (None, None)) \
                if isinstance(item, dict) and len(item) == 1 else (None, None)
            if name not in RECOVERY_STEPS:
                close = difflib.get_close_matches(str(name), RECOVERY_STEPS, n=1)
                raise ValueError(f"unknown recovery step {item!r}" + (f": did you mean {close[0]!r}?" if close else "")
                                 + f" (steps: {', '.join(RECOVERY_STEPS)}; each a name or a one-key mapping)")
            if name in steps:
                raise ValueError(f"recovery step {name!r} is given twice")
            steps[name] = {} if knobs is None else knobs
        return steps

    @property
    def steps(self) -> list[str]:
        """The steps that are on, in the order they run.

        >>> Recovery.model_construct(bias_correction=BiasCorrection(), equalization=Equalization()).steps
        ['equalization', 'bias_correction']
        """
        return [s for s in ("equalization", "smoothquant", "bias_correction") if getattr(self, s) is not None]


class Target(Section):
    """The deployment target decisions are made for (README "Targets"): a profile (`auto`, a
    shipped name, or a file from `qcli target measure`), the batch the model is served at, and
    the threads it runs on (None: the profile's). `target: NAME` is short for `{profile: NAME}`."""

    profile: str = Field("auto", min_length=1)
    batch: int = Field(1, ge=1)
    threads: int | None = Field(None, ge=1)

    @model_validator(mode="before")
    @classmethod
    def _short(cls, value: Any) -> Any:
        return {"profile": value} if isinstance(value, str) else value


class Verify(Section):
    enabled: bool = True
    # predicted: from the target profile (deterministic); measured: this machine's clock (A/B)
    latency: Literal["predicted", "measured"] = "predicted"
    min_top1_agreement: float = Field(0.99, ge=0, le=1)
    min_cosine: float = Field(0.99, ge=-1, le=1)
    max_latency_ratio: float | None = Field(1.0, gt=0)  # None: no latency floor
    min_float_ms: float = Field(0.1, ge=0)  # the latency floor applies when float takes this long
    samples: int = Field(64, ge=1)  # held-back samples compared
    folds: int = Field(4, ge=1)  # a folder too small to hold samples back: k-fold (1: compare on calibration's)
    rescue: bool = True
    max_trials: int = Field(64, ge=1)  # the rescue's budget
    time_budget: float = Field(120.0, gt=0)  # seconds
    # output name -> the metric it is judged by (qcli.analyze.kinds; unnamed outputs: detected)
    outputs: dict[str, OutputKindName] = {}
    ctc_blank: int | None = Field(None, ge=0)  # a sequence's CTC blank class (None: detected)
    # output name -> the value above which a mask output's element or label is "on" (default 0.5
    # for probabilities, 0 for logits)
    thresholds: dict[str, float] = {}
    # how sure a pass must be: the one-sided confidence of each interval's lower end
    # (qcli.analyze.confidence; 0.975: the ~95% two-sided interval)
    confidence: float = Field(0.975, gt=0.5, lt=1)
    # classes not counted at either end of a sequence (an OCR recognizer's space: str.strip)
    sequence_trim: list[Annotated[int, Field(ge=0)]] = []
    metric: str | None = Field(None, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")  # package.module:function


class AutoPrecision(Section):
    enabled: bool = False
    criteria: Criterion = "balanced"
    max_accuracy_drop: float = Field(0.01, ge=0)
    min_speedup: float | None = Field(None, gt=0)
    candidates: list[Candidate] = ["int8", "dynamic", "int16", "float"]
    samples: int = Field(256, ge=1)  # samples of --eval-data (or held back) measured per trial
    max_trials: int = Field(200, ge=1)
    time_budget: float = Field(600.0, gt=0)  # seconds

    @field_validator("candidates")
    @classmethod
    def _one_half_candidate(cls, candidates: list[Candidate]) -> list[Candidate]:
        """Both 16-bit float types listed: refused here, where the list is, even while the search
        is off (`--auto-precision` would turn it on, and the whole config would then be refused,
        at no line: `Config._one_half_type`)."""
        if set(HALF_PRECISIONS) <= set(candidates):
            raise ValueError("float16 and bfloat16 both listed: a model runs in one 16-bit float type, choose one")
        return candidates


class Data(Section):
    preprocess: Preprocess | None = None  # a pydantic model of its own: its errors carry the key's line


class Config(Section):
    version: Literal[1] = 1
    # what a node no override gives a precision runs in: quantized (activations, weights), or float16/bfloat16
    default_precision: Literal["quantized", "float16", "bfloat16"] = "quantized"
    calibration: Calibration = Calibration()
    activations: Activations = Activations()
    weights: Weights = Weights()
    bias: Literal["int32"] = "int32"
    exclude: Match = Match()
    overrides: list[Override] = []
    verify: Verify = Verify()
    auto_precision: AutoPrecision = AutoPrecision()
    recovery: Recovery = Recovery()
    data: Data = Data()
    target: Target = Target()

    @model_validator(mode="after")
    def _one_half_type(self) -> Config:
        # the candidates count with the search off too: a flag (--auto-precision) turns it on,
        # and the file would then be refused as the command line's
        if len(self._halves() | (set(HALF_PRECISIONS) & set(self.auto_precision.candidates))) > 1:
            raise ValueError("float16 and bfloat16 in one model: choose one (default_precision, overrides' "
                             "precision, auto_precision.candidates)")
        return self

    def _halves(self) -> set[str]:
        found: set[str] = {o.precision for o in self.overrides if o.precision in HALF_PRECISIONS}
        found |= set(HALF_PRECISIONS) & set(self.auto_precision.candidates) if self.auto_precision.enabled else set()
        return found | ({self.default_precision} & set(HALF_PRECISIONS))

    @property
    def half(self) -> str | None:
        """The 16-bit float type this config runs nodes in (float16, bfloat16), if any."""
        return next(iter(self._halves()), None)

    @field_validator("weights")
    @classmethod
    def _dynamic_weights(cls, w: Weights, info: ValidationInfo) -> Weights:
        activations = info.data.get("activations")
        return check_dynamic_weights(w) if activations is not None and activations.mode == "dynamic" else w

    def merged(self, **sections: dict[str, Any]) -> Config:
        """This config with command-line values laid over it, e.g.
        `cfg.merged(calibration={"method": "kl"})`; None values are ignored."""
        raw = self.model_dump(exclude={"data", "recovery"})
        raw["recovery"] = self.recovery.model_dump(exclude_none=True)  # None is "off"; in YAML a bare step is on
        for section, values in sections.items():
            for key, value in values.items():
                if value is not None:
                    raw.setdefault(section, {})[key] = value
        try:
            merged = Config.model_validate(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            key = key_path(first["loc"])
            raise ConfigError(f"command line: {key}: {first['msg']}") from None
        return merged.model_copy(update={"data": self.data})


def parse_config(raw: Any, source: str = "config", lines: dict[tuple, int] | None = None) -> Config:
    """Validate a mapping (parsed YAML); errors name `source`, the line and the key path."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of sections, got {type(raw).__name__}")
    try:
        return Config.model_validate(raw)
    except ValidationError as exc:
        raise config_error(exc, raw, source, lines or {}, Config) from None


PRESETS = Path(__file__).parent / "presets"  # the repository's configs/, shipped in wheels


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESETS.glob("*.yaml"))


def resolve_config(value: str | os.PathLike) -> Path:
    """A config file path, or the preset of that name (`--config tensorrt`)."""
    path = Path(value)
    if path.is_file():
        return path
    if path.is_dir():
        raise ConfigError(f"{path} is a folder, not a config file", hint="pass the .yaml file")
    text = str(value)
    if "/" not in text and path.suffix not in (".yaml", ".yml"):
        preset = PRESETS / f"{text}.yaml"
        if preset.is_file():
            return preset
        close = difflib.get_close_matches(text, preset_names(), n=1)
        raise ConfigError(
            f"no config file or preset named {text!r}",
            hint=(f"did you mean {close[0]!r}? " if close else "") + f"presets: {', '.join(preset_names())}",
        )
    raise ConfigError(f"config file not found: {path}")


def load_config(path: str | os.PathLike | None) -> Config:
    """The config in a YAML file or preset (None: the defaults)."""
    if path is None:
        return Config()
    path = resolve_config(path)
    raw, lines = read_yaml(path, "config file")
    return parse_config(raw, str(path), lines)


def load_preprocess(path: str | os.PathLike | None) -> Preprocess | None:
    """The `data.preprocess` section of a config file, validated, or None when absent."""
    return load_config(path).data.preprocess


def config_document(config: Config) -> dict:
    """The resolved config as plain data (for `qcli config show`, metadata and reports)."""
    doc = config.model_dump(mode="json", exclude={"data", "recovery"})
    if config.default_precision == "quantized":  # the default: models made without it keep their bytes
        del doc["default_precision"]
    steps = config.recovery.model_dump(mode="json", exclude_none=True)
    if steps:  # only when a step is on: models made without recovery keep their bytes
        doc["recovery"] = steps
    if config.data.preprocess is not None:
        pre = config.data.preprocess.model_dump(mode="json", exclude_none=True)
        doc["data"] = {"preprocess": pre}
    return doc


def config_yaml(config: Config) -> str:
    return yaml.safe_dump(config_document(config), sort_keys=False)
