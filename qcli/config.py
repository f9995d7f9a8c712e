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
from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator

from qcli.configerrors import config_error, key_path
from qcli.configparts import ROUNDING, Prepare, Recovery, Section, Target
from qcli.data import Preprocess, Reading
from qcli.data.text import DEFAULT_SEQ_LEN
from qcli.errors import ConfigError
from qcli.yamlfile import read_yaml

Method = Literal["minmax", "percentile", "kl", "mse"]
ActivationDtype = Literal["uint8", "int8", "uint16", "int16", "float8e4m3fn", "float8e5m2", "float"]  # float: w-only
WeightDtype = Literal["int8", "uint8", "int16", "int4", "uint4", "int2", "uint2", "float8e4m3fn",
                      "float8e5m2"]  # int16: weight-only; int2/uint2: per block, MatMul only
FLOAT8 = ("float8e4m3fn", "float8e5m2")  # FP8: symmetric only (zero point 0), opset 19
GranularityName = Literal["per_tensor", "per_channel", "per_block"]  # the core types it: scheme.granularity_of
Criterion = Literal["performance", "balanced", "accuracy", "custom"]
# dynamic: run-time activation scales; float16/bfloat16: run in that type, unquantized
Precision = Literal["float", "int8", "uint8", "int16", "uint16", "dynamic", "float16", "bfloat16"]
HALF_PRECISIONS = ("float16", "bfloat16")  # float nodes run in a 16-bit float type (qcli/half.py)
NO_QDQ = ("float", "dynamic", *HALF_PRECISIONS)  # precisions whose nodes get no static Q/DQ pair
Mode = Literal["static", "dynamic"]
# qcli.analyze.kinds.Kind
OutputKindName = Literal["top1", "sequence", "cosine", "mask", "map", "regression", "boxes", "per_element",
                         "ignore", "tokens"]
# int4: weights, to shrink; float16/bfloat16: the node in that type (one of them per model)
Candidate = Literal["float", "int8", "uint8", "int16", "uint16", "int4", "dynamic", "float16", "bfloat16"]
SYMMETRIC = "zero point 0 (signed types) or mid-range (unsigned)"  # the description of both `symmetric` keys


class Calibration(Section):
    method: Method = Field("mse", description="how each tensor's range is solved from the statistics (`--method`)")
    percentile: float = Field(99.999, gt=50, le=100, description="for `percentile`: the percentile of the values "
                              "kept (symmetric schemes: of the absolute values) (`--percentile`)")
    samples: int = Field(256, ge=1, description="the first N samples of `--data` calibration reads (`--samples`)")
    batch_size: int = Field(8, ge=1, description="samples per inference batch, an upper bound: a run aims at 64 MB "
                            "of observed tensors (`--batch-size`)")
    bins: int = Field(2048, ge=128, le=1 << 16, description="histogram bins across each range (KL works on them)")


class Activations(Section):
    """`mode: dynamic` quantizes activations at run time (docs/guides/formats.md): to
    uint8 with an asymmetric range per tensor, which is what onnxruntime's DynamicQuantizeLinear
    computes, so other dtypes and `symmetric` cannot go with it."""

    dtype: ActivationDtype = Field("uint8", description=(
        "`float`: weight-only quantization (8-bit weights written as Cast, Mul, which onnxruntime folds at load: "
        "the file 4x smaller at float's speed and numerics; 4-bit ones as DequantizeLinear, fused into "
        "MatMulNBits); float8: symmetric only; 16 bits run in float between their Q/DQ pairs (no fused kernel)"))
    symmetric: bool = Field(False, description=SYMMETRIC)
    mode: Mode = Field("static", description=(
        "`dynamic`: activations quantized at run time by onnxruntime's kernels (uint8 asymmetric only; weights "
        "8-bit per channel or per tensor), no calibration"))

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
    dtype: WeightDtype = Field("int8", description=(
        "float8: symmetric, per channel or per tensor; `int16`: per channel or per tensor, for weight-only nodes "
        "(written as Cast, Mul, folded at load: half the float bytes at float's speed); a node with quantized "
        "activations reads 16-bit weights through a DequantizeLinear and computes in float"))
    symmetric: bool = Field(True, description=SYMMETRIC)
    granularity: GranularityName = Field("per_channel", description=(
        "one scale per tensor, per output channel (Conv out-channels, Gemm's N axis, a MatMul matrix's columns), "
        "or per block of `block_size` along the reduction axis"))
    algorithm: Literal["rtn", "gptq", "awq", "hqq"] = Field("rtn", description=(
        "how integer weights are rounded: `rtn` each value to its nearest; `gptq` MatMul, Gemm and Conv weights one "
        "input row at a time, each rounding error spread onto the rows left by the Gram matrix of the layer's inputs "
        "(a Conv's: of its input's patches) on the calibration samples (needs `--data`; qcli/gptq.py); `awq` "
        "per-block MatMul and Gemm weights of float "
        "inputs scaled up on the input channels that are large on the calibration samples (the input divided), "
        "then each block's range clipped, both by the error at the layer's output (needs `--data`; qcli/awq.py); `hqq` "
        "each group's scale moved by HQQ's half-quadratic steps (an l_p split, p 0.7, that lets a few large errors "
        "stand) and kept where the weight's squared error is least, zero points integer (no data; qcli/hqq.py)"))
    embeddings: Literal["auto", "int8", "float"] = Field("auto", description=(
        "constant tables only a Gather reads (a decoder's token and position embeddings, untied): `int8` stores "
        "them int8 per column, the rows read dequantized after the Gather (only those rows: no Q/DQ on "
        "activations, read speed unchanged); `float` keeps them; `auto` int8 in dynamic mode (as onnxruntime's "
        "quantize_dynamic), float otherwise. A table also read by a projection (tied) stays as the plan makes it"))
    # larger than any weight's axis: one block per channel
    block_size: int = Field(32, ge=8, le=1 << 16, description=(
        "a power of two: the block of `per_block` (opset 21: a config asking for it prepares models below at 21). "
        "8-bit blocks of a node with quantized activations run per channel, with a note (onnxruntime's int8 "
        "kernel takes one scale per output channel); weight-only nodes and int4/uint4 keep their blocks"))

    @field_validator("block_size")
    @classmethod
    def _power_of_two(cls, v: int) -> int:
        if v & (v - 1):
            raise ValueError(f"block_size must be a power of two, got {v}")
        return v

    @model_validator(mode="after")
    def _dtype_and_granularity(self) -> Weights:
        if self.dtype in (*FLOAT8, "int16") and self.granularity == "per_block":
            raise ValueError(f"{self.dtype} weights are per channel or per tensor, not per block")
        check_float8(self.dtype, self.symmetric)
        if self.dtype in ("int2", "uint2") and self.granularity != "per_block":
            raise ValueError(f"{self.dtype} weights are per block (granularity: per_block): onnxruntime runs 2-bit "
                             "weights only as MatMulNBits, which reads blocks")
        return self

    @property
    def from_data(self) -> bool:
        """Whether the weights are rounded from the calibration samples (GPTQ, AWQ): a k-fold
        verification then builds each fold's model from its own samples, weight-only ones too."""
        return self.algorithm in ("gptq", "awq")


def check_float8(dtype: str, symmetric: bool) -> None:
    """A float8 scheme is symmetric: its zero point is 0 (scale = range / the type's largest)."""
    if dtype in FLOAT8 and not symmetric:
        raise ValueError(f"{dtype} is symmetric only (zero point 0): set symmetric: true")


class Match(Section):
    """Selects nodes (by name pattern AND op type when both are given) and tensors by name.
    Patterns are globs (`/encoder/*`) or `re:<regex>` (full match)."""

    nodes: list[str] = Field([], description="node names: globs (`/head/*`) or `re:<regex>` (full match)")
    op_types: list[str] = Field([], description="op types as ONNX spells them (`Conv`, `MatMul`)")
    tensors: list[str] = Field([], description="tensor names: globs or `re:<regex>` (full match)")

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
    method: Method | None = Field(None, description="the range method of the matched tensors")
    percentile: float | None = Field(None, gt=50, le=100, description="its percentile, for `percentile`")


class Override(Section):
    match: Match = Field(description=(
        "what the rule applies to: nodes by name AND op type when both are given; tensors by name; at least one"))

    @field_validator("match")
    @classmethod
    def _selects_something(cls, m: Match) -> Match:
        if not (m.nodes or m.op_types or m.tensors):
            raise ValueError("match needs at least one of nodes, op_types, tensors")
        return m

    precision: Precision | None = Field(None, description=(
        "`float`: the same as exclude; `dynamic`: the matched nodes quantized dynamically (needs `match.nodes` or "
        "`match.op_types`); `float16`/`bfloat16`: the matched nodes run unquantized in that type (nodes only; one "
        "of the two per model); otherwise the activation dtype (it also quantizes ops that are float by default, "
        "e.g. Softmax)"))
    activations: Activations | None = Field(None, description=(
        "the activation scheme of the matched nodes' quantized tensors, or of the matched tensors"))
    weights: Weights | None = Field(None, description="the weight scheme of the matched nodes' weights")
    calibration: CalibrationOverride | None = Field(None, description="the range method for the matched tensors")
    range: tuple[float, float] | None = Field(None, description="a fixed range `[low, high]` for the matched "
                                              "tensors (no calibration)")

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
        if self.weights is not None and self.weights.algorithm != "rtn":
            raise ValueError("weights.algorithm is one per model: set it in the top-level weights section")
        if self.weights is not None and self.weights.embeddings != "auto":
            raise ValueError("weights.embeddings is one per model: set it in the top-level weights section")
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


class Verify(Section):
    enabled: bool = Field(True, description="compare the quantized model with the float model after quantizing "
                          "(`--no-verify`: off)")
    latency: Literal["predicted", "measured"] = Field("predicted", description=(
        "latency verdicts from the target profile (the same on any machine) or this machine's A/B timing"))
    min_top1_agreement: float = Field(0.99, ge=0, le=1, description=(
        "the floor of agreements with the float model: top-1, sequence, per-element outputs, and the IoU of "
        "a mask that is not a map (multi-label scores, one probability per sample) (`--min-top1-agreement`)"))
    min_spatial_agreement: float | None = Field(0.95, ge=0, le=1, description=(
        "the floor of maps' IoU (masks, class maps, a dense map's top region) and detectors' boxes matched "
        "(F1); `null`: `min_top1_agreement`'s (`--min-spatial-agreement`)"))
    min_cosine: float = Field(0.99, ge=-1, le=1, description="the floor of mean cosines: embeddings and other "
                              "float outputs (`--min-cosine`)")
    max_relative_error: float = Field(0.1, gt=0, description=(
        "the ceiling of `regression` outputs' RMS error over their spread across the compared samples (0.1: "
        "the quantized output explains 99% of the float one's variance, as a cosine of 0.99 does a vector)"))
    max_perplexity_increase: float = Field(0.02, gt=0, description=(
        "the ceiling of a language model's perplexity on the compared text, quantized / float - 1 (`tokens` "
        "outputs; 0.02: 2% higher)"))
    min_token_agreement: float | None = Field(None, ge=0, le=1, description=(
        "a language model's floor on next-token agreement: the share of the compared text's positions whose "
        "next-token argmax (greedy decoding's choice) is float's (`tokens` outputs; `null`: reported only)"))
    max_token_kl: float | None = Field(None, gt=0, description=(
        "a language model's ceiling on the mean KL divergence of its next-token distribution from float's, in "
        "nats (`tokens` outputs; `null`: reported only)"))
    max_latency_ratio: float | None = Field(1.0, gt=0, description=(
        "ceiling on quantized / your model file's latency, at `target.batch` (`--max-latency-ratio`; `null`: none)"))
    min_memory_reduction: float | None = Field(None, gt=0, description=(
        "floor on the weights onnxruntime holds to run your model file / the written model's (the graph it runs "
        "after its fusions, as `qcli analyze --min-memory-reduction` reads it; `null`: none); a miss exits 1, "
        "the rescue promotes nothing for it"))
    min_float_ms: float = Field(0.1, ge=0, description="the latency floor applies when the float model takes "
                                "at least this long per run")
    samples: int = Field(64, ge=1, description="samples compared (held back from calibration, or of `--eval-data`)")
    folds: int = Field(4, ge=1, description=(
        "a `--data` folder too small to hold samples back is verified by k-fold with this many folds; `1`: on "
        "the calibration samples themselves"))
    rescue: bool = Field(True, description="search precisions when a floor is missed (`--no-rescue`: exit 1 instead)")
    max_trials: int = Field(64, ge=1, description="the rescue's budget, in trials")
    time_budget: float = Field(120.0, gt=0, description="seconds: reported when a rescue runs past it, never a stop")
    outputs: dict[str, OutputKindName] = Field({}, description=(
        "how each named output is judged (an unknown name is an error listing the model's outputs); unnamed "
        "outputs: decided from the op that computes them and their values"))
    ctc_blank: int | None = Field(None, ge=0, description=(
        "the CTC blank class of `sequence` outputs (`null`: detected); a class their last axis lacks is refused"))
    thresholds: dict[str, float] = Field({}, description=(
        "a mask output's threshold: the value above which its element or label is \"on\" (default 0.5 for "
        "probabilities, 0 for logits); an output judged otherwise is refused"))
    confidence: float = Field(0.975, gt=0.5, lt=1, description=(
        "how sure a pass must be: the one-sided confidence of each interval's lower end (0.975: the ~95% "
        "two-sided interval); each agreement check states what its samples show at it"))
    sequence_trim: list[Annotated[int, Field(ge=0)]] = Field([], description=(
        "classes not counted at either end of a `sequence`, as `str.strip` does (an OCR recognizer's space)"))
    metric: str | None = Field(None, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$",
                               json_schema_extra={"values": "`package.module:function` or `null`"}, description=(
        "your own metric, `package.module:function`, called per compared sample; returns `(score, floor)`"))


class AutoPrecision(Section):
    enabled: bool = Field(False, description="search a precision per node (`--auto-precision`)")
    criteria: Criterion = Field("balanced", description=(
        "the goal: `performance` (drop within budget at the least cost), `balanced` (aims at half the budget, "
        "settles for the whole), `accuracy` (promote as far as `min_speedup` allows), `custom` (both limits)"))
    max_accuracy_drop: float = Field(0.01, ge=0, description=(
        "the budget, in the metric's units: top-1 points as a fraction with labels, else 1 - agreement, "
        "1 - cosine, or a regression's unexplained variance (its relative error squared) "
        "(`--max-accuracy-drop`)"))
    min_speedup: float | None = Field(None, gt=0, description="the speed floor, float / quantized latency "
                                      "(`--min-speedup`; `accuracy` criterion: 1.0 when unset)")
    candidates: list[Candidate] = Field(["int8", "dynamic", "int16", "float"], description=(
        "the promotions searched, dynamic (then float16/bfloat16) before float; `int8` is always the base; "
        "`int4`: 4-bit weights to shrink within the budget; `uint16`/`uint8` mean `int16`/`int8`"))
    max_size_mb: float | None = Field(None, gt=0, description=(
        "a size budget for the written model, in MB (10^6 bytes; `--max-size-mb`; needs `int4` among the "
        "candidates): int4 weights on the layers whose 4-bit weights add the least noise per byte they save, "
        "the fewest that fit, instead of as many as the accuracy budget allows; the budget and floors still gate"))
    samples: int = Field(256, ge=1, description=(
        "samples of `--eval-data` (or held back) measured per trial (and compared by `analyze --sensitivity`)"))
    max_trials: int = Field(200, ge=1, description=(
        "the search's budget, in trials (`--max-trials`; also `analyze --sensitivity`'s)"))
    time_budget: float = Field(600.0, gt=0, description="seconds: reported when passed, never a stop "
                               "(`--time-budget`)")

    @model_validator(mode="after")
    def _size_needs_int4(self) -> AutoPrecision:
        if self.max_size_mb is not None and "int4" not in self.candidates:
            raise ValueError("max_size_mb shrinks the model with int4 weights: add int4 to candidates")
        return self

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
    # a pydantic model of its own: its errors carry the key's line
    preprocess: Preprocess | None = Field(None, description="how image files become model inputs, in order: "
                                          "decode, channels, resize, center_crop, scale, mean/std, layout, dtype")
    seq_len: int = Field(DEFAULT_SEQ_LEN, ge=2, description=(
        "a text data folder's chunk length in tokens (`--seq-len`): each file is encoded with the folder's "
        "tokenizer.json and cut into chunks this long, one prompt each"))

    @property
    def reading(self) -> Reading:
        """How a data folder's files become inputs, by this section."""
        return Reading(self.preprocess, self.seq_len)


class Config(Section):
    version: Literal[1] = Field(1, description="the schema version")
    default_precision: Literal["quantized", "float16", "bfloat16"] = Field("quantized", description=(
        "what a node no override gives a precision runs in: quantized as `activations` and `weights` say, or "
        "the 16-bit float type"))
    calibration: Calibration = Field(Calibration(), description=(
        "How activation ranges are found: one pass over the first `samples` of `--data`, then a range method. "
        "The flags `--method`, `--percentile`, `--samples` and `--batch-size` override these keys."))
    activations: Activations = Field(Activations(), description="The scheme of quantized activations.")
    weights: Weights = Field(Weights(), description="The scheme of quantized weights.")
    bias: Literal["int32"] = Field("int32", description=(
        "bias scale = input scale x weight scale (Gemm: x alpha / beta), on its node's accumulator grid"))
    exclude: Match = Field(Match(), description=(
        "Nodes, op types and tensors kept float. An excluded node reads its inputs unquantized."))
    overrides: list[Override] = Field([], description=(
        "Rules applied in order, a later one winning. A rule that matches nothing is a warning naming the "
        "closest names (`--strict`: an error)."))
    verify: Verify = Field(Verify(), description=(
        "After every quantize: the quantized model compared with the float model on samples calibration did not "
        "read, against floors; a missed floor starts the rescue, else exit 1."))
    auto_precision: AutoPrecision = Field(AutoPrecision(), description=(
        "Automatic mixed precision (`--auto-precision`): a precision per node that meets an accuracy budget at "
        "the least speed cost."))
    recovery: Recovery = Field(Recovery(), description=(
        "Optional steps that keep int8 accurate without going float, all off by default. Written as a list of "
        "step names or one-key mappings with their knobs (`[equalization, {smoothquant: {alpha: auto}}]`); "
        "they run in a fixed order (equalization, smoothquant, seq_mse, adaround, bias_correction), not the list's."))
    data: Data = Field(Data(), description="How the samples of a data folder become model inputs.")
    prepare: Prepare = Field(Prepare(), description=(
        "The float model's preparation: the passes left out (a verified run leaves out the ones predicted to "
        "make your model slower on the target)."))
    target: Target = Field(Target(), description=(
        "The deployment target latency decisions are made for. `target: NAME` is short for "
        "`target: {profile: NAME}`."))

    @model_validator(mode="after")
    def _one_half_type(self) -> Config:
        # the candidates count with the search off too: a flag (--auto-precision) turns it on,
        # and the file would then be refused as the command line's
        if len(self._halves() | (set(HALF_PRECISIONS) & set(self.auto_precision.candidates))) > 1:
            raise ValueError("float16 and bfloat16 in one model: choose one (default_precision, overrides' "
                             "precision, auto_precision.candidates)")
        return self

    @model_validator(mode="after")
    def _algorithm_alone(self) -> Config:
        # GPTQ and AWQ round the prepared graph's weights on their inputs' statistics; these steps
        # change both (a smoothed weight is scaled, its input divided): they would not match
        steps = [s for s in ("smoothquant", "equalization", *ROUNDING, "bias_correction") if s in self.recovery.steps]
        if self.weights.algorithm != "rtn" and steps:  # HQQ: its weights are solved once, on the prepared graph
            raise ValueError(f"weights.algorithm {self.weights.algorithm} does not combine with recovery step "
                             f"{steps[0]}: drop one of the two")
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
    raw = {} if raw is None else raw
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


def config_document(config: Config) -> dict:
    """The resolved config as plain data (for `qcli config show`, metadata and reports)."""
    doc = config.model_dump(mode="json", exclude={"data", "recovery"})
    if config.default_precision == "quantized":  # the default: models made without it keep their bytes
        del doc["default_precision"]
    steps = config.recovery.model_dump(mode="json", exclude_none=True)
    if steps:  # only when a step is on: models made without recovery keep their bytes
        doc["recovery"] = steps
    if config.data.preprocess is not None:
        doc["data"] = {"preprocess": config.data.preprocess.model_dump(mode="json", exclude_none=True)}
    for weights in [doc["weights"], *(o["weights"] for o in doc["overrides"] if o.get("weights"))]:
        for key, default in (("algorithm", "rtn"), ("embeddings", "auto")):
            if weights.get(key) == default:  # the default: models made before it existed keep their bytes
                del weights[key]
    return doc


def config_yaml(config: Config) -> str:
    return yaml.safe_dump(config_document(config), sort_keys=False)
