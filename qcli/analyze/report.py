"""The analysis `Report`: plain dataclasses, one JSON schema (`qcli-analysis/1`).

`Report.to_dict()` gives the JSON document with keys in a fixed order (field order below);
`Report.from_dict()` reads it back (`from_dict(to_dict(r)) == r`). Numbers are rounded when
the report is built (6 significant digits; latencies to 0.1 µs), so two runs over the same
models and data give the same document except for timings: the `speed` section and the
`min_speedup` gate.

Units: accuracies, agreements and drops are fractions (0.01 = one point); SQNR in dB (None
when the quantized tensor equals the float one exactly); latencies in milliseconds; sizes in bytes.
"""

from __future__ import annotations

import builtins
import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

from qcli.errors import QcliError
from qcli.textfile import REFUSED, read_text

FORMAT = "qcli-analysis/1"


@typing.overload
def rounded(x: float, digits: int = 6) -> float: ...
@typing.overload
def rounded(x: None, digits: int = 6) -> None: ...
@typing.overload
def rounded(x: float | None, digits: int = 6) -> float | None: ...
def rounded(x: float | None, digits: int = 6) -> float | None:
    """`x` to `digits` significant digits (None stays None)."""
    if x is None:
        return None
    return float(f"{x:.{digits}g}")


def rounded_pair(pair: tuple[float, float] | None, digits: int = 6) -> list[float] | None:
    """An interval for JSON: [low, high], each `rounded` (None stays None)."""
    return None if pair is None else [rounded(pair[0], digits), rounded(pair[1], digits)]


@dataclass
class ModelInfo:
    path: str
    fingerprint: str
    quantization: dict | None = None  # the quantized model's `qcli.config` metadata, when present


@dataclass
class DataInfo:
    path: str
    layout: str
    samples: int
    labelled: int
    labels_file: str | None
    batch_size: int
    reference_outputs: bool


@dataclass
class ClassAccuracy:
    """Top-k of one model against the labels."""

    top1: float
    top5: float | None


@dataclass
class Accuracy:
    """Against ground-truth labels, on the class-score output `output`."""

    output: str
    classes: int
    samples: int  # labelled samples counted
    float: ClassAccuracy
    quantized: ClassAccuracy
    # builtins.float: within the class body, `float` names the field above.
    top1_drop: builtins.float  # float top-1 - quantized top-1
    top5_drop: builtins.float | None


@dataclass
class Fidelity:
    """How closely one output follows a reference (the float model, or reference outputs)."""

    output: str
    kind: str  # top1 | sequence | cosine | mask | map | regression | boxes | per_element | ignore | tokens
    samples: int
    top1_agreement: float | None  # class-scores only
    cosine: float | None  # mean per-sample cosine similarity (float outputs)
    cosine_min: float | None
    sqnr_db: float | None  # over every element; None = no error at all
    max_abs_error: float | None
    exact_match: float  # fraction of samples bit-identical
    nonfinite: int = 0  # elements with NaN/Inf on either side, left out of SQNR and cosine
    agreement: float | None = None  # kind per_element (class ids, masks): fraction of elements equal
    reason: str = ""  # why the output is of its kind
    sequence_agreement: float | None = None  # sequence: whole (CTC-collapsed) argmax sequences unchanged
    position_agreement: float | None = None  # sequence: positions whose argmax is unchanged
    predicted_agreement: float | None = None  # top-1, sequence: what unseen samples would keep (analyze.margins)
    mask_agreement: float | None = None  # mask: elements on the same side of the threshold
    mask_iou: float | None = None  # mask: mean per-sample IoU of the thresholded masks
    agreement_interval: list[float] | None = None  # ~95% interval of the agreement of its kind (analyze.verdict)
    cosine_interval: list[float] | None = None  # ~95% interval of the mean cosine
    relative_error: float | None = None  # regression: RMS error over the float values' spread
    box_f1: float | None = None  # boxes: mean per-sample F1 of the two models' detections at IoU 0.5
    boxes: int | None = None  # boxes: the reference's detections over all samples
    top5_agreement: float | None = None  # top1 (5 classes or more): float's top-1 in the quantized top 5
    map_iou: float | None = None  # map: mean per-sample IoU of the two models' top tenths
    psnr_db: float | None = None  # map: mean per-sample PSNR over the reference sample's range
    error_interval: list[float] | None = None  # its interval
    perplexity: float | None = None  # tokens: the compared model's perplexity on the text's next tokens
    float_perplexity: float | None = None  # tokens: the reference model's
    perplexity_increase: float | None = None  # tokens: perplexity / float_perplexity - 1
    perplexity_interval: list[float] | None = None  # its interval
    token_agreement: float | None = None  # tokens: positions whose next-token argmax agrees
    kl: float | None = None  # tokens: mean KL divergence of the next-token distributions, nats


@dataclass
class ReferenceFidelity:
    """Both models against the reference outputs stored with the data (`output_<i>.pb`)."""

    output: str
    float: Fidelity
    quantized: Fidelity


@dataclass
class LayerError:
    """Error of one quantized activation: float model's tensor vs quantized model's dequantized one."""

    tensor: str  # name in the float model
    quantized_tensor: str  # name in the quantized model (usually `<tensor>_dequantized`)
    node: str  # producing node in the float model ("" for a graph input)
    op_type: str  # its op type ("input" for a graph input)
    dtype: str  # quantized type (uint8, int8, ...)
    elements: int
    sqnr_db: float | None
    mse: float  # mean squared error
    signal_power: float  # mean squared float value
    max_abs_error: float
    nonfinite: int = 0  # elements with NaN/Inf on either side, left out of the sums


@dataclass
class Layers:
    tensors: list[LayerError]  # graph order
    skipped: list[str] = field(default_factory=list)  # "name: why" for quantized tensors not measured

    def worst(self, n: int) -> list[LayerError]:
        """The n lowest-SQNR tensors (exact ones last), worst first."""
        ranked = sorted(
            self.tensors,
            key=lambda t: (t.sqnr_db is None, t.sqnr_db if t.sqnr_db is not None else 0.0),
        )
        return ranked[:n]


@dataclass
class Latency:
    """Latency of one model over the timed runs, in milliseconds."""

    median_ms: float
    p90_ms: float
    mean_ms: float
    min_ms: float
    max_ms: float
    throughput: float  # samples per second at the median
    runs_ms: list[float]  # every timed run, in run order


@dataclass
class Speed:
    threads: int | None  # None: onnxruntime's default
    batch: int
    warmup: int
    runs: int
    order: str  # how the runs of the two models were interleaved
    float: Latency
    quantized: Latency
    speedup: builtins.float  # float median / quantized median (builtins: `float` is the field above)


@dataclass
class Decode:
    """A decoder's speed in tokens (qcli.analyze.decode): `step`, one decode step after the
    timed prompt of `prompt_tokens` tokens a sample, timed as `Speed` times the prompt."""

    prompt_tokens: int
    step: Speed


@dataclass
class Predicted:
    """Latency predicted by a target profile (qcli.target): what `min_speedup` gates on unless
    `verify.latency: measured`."""

    target: str  # the profile and how it was chosen, the batch
    batch: int
    float_ms: builtins.float
    quantized_ms: builtins.float
    speedup: builtins.float  # float / quantized
    # a decoder's decode step after the prompt (qcli.analyze.decode), by the same profile
    decode_float_ms: builtins.float | None = None
    decode_quantized_ms: builtins.float | None = None
    decode_speedup: builtins.float | None = None


@dataclass
class Memory:
    """What onnxruntime holds to run each model (qcli.target.executed): the constants of the
    graph it runs after its optimizations (MatMulNBits keeps 4-bit blocks; a float16 weight
    cast to float is folded at load into float), and a decoder's key/value cache after the prompt of
    `cache_tokens` tokens at the served batch (the same for both: qcli leaves it float)."""

    float_weight_bytes: int
    quantized_weight_bytes: int
    reduction: builtins.float  # float / quantized weights held
    cache_bytes: int | None = None
    cache_tokens: int | None = None


@dataclass
class DtypeBytes:
    count: int
    bytes: int


@dataclass
class ModelSize:
    file_bytes: int  # the .onnx file plus its external data files
    external_data: list[str]
    weight_bytes: int  # initializers and Constant-node tensors
    weights: dict[str, DtypeBytes]  # by dtype


@dataclass
class Size:
    float: ModelSize
    quantized: ModelSize
    compression: builtins.float  # float file bytes / quantized file bytes (builtins: as in Speed)


@dataclass
class GateResult:
    name: str  # max_accuracy_drop | min_speedup | min_compression
    metric: str  # what was measured, e.g. "top-1 drop", "1 - top-1 agreement", "speedup"
    value: float | None
    threshold: float
    passed: bool
    margin: float | None  # how far past the threshold (positive: room left, negative: short by)
    message: str


@dataclass
class UnitSensitivity:
    """One quantized unit (qcli.precision.units): what it costs on its own, and what keeping it
    float gains. Losses are in the metric's units (`Sensitivity.metric`); noise shares are of
    the quantized model's output noise. None: not measured (the budget ran out first)."""

    node: str  # the unit: its first node (what `overrides[].match.nodes` matches)
    op_type: str
    nodes: list[str]  # all its nodes (nodes reading one weight are one unit)
    precision: str  # how the quantized model runs it ("uint8 act, int8 weights", "dynamic ...")
    rank: int | None  # 1: the most sensitive; None: not measured
    alone_loss: float | None  # the float model with only this unit quantized: its loss
    alone_noise: float | None  # ... its output noise, as a share of the quantized model's
    float_gain: float | None  # the quantized model with this unit float: the loss it removes
    float_noise: float | None  # ... the share of the output noise it removes
    float_units: int | None  # units left unquantized then (keeping one float can take neighbours along)


@dataclass
class Sensitivity:
    """Per-unit sensitivity of the quantized model, rebuilt from how qcli made it (its metadata),
    measured on `samples` samples (`source`) against the float model (labels left out). Units
    ranked: the noise keeping each float removes, then the loss it removes, then its noise and
    loss alone, then its name; unmeasured last."""

    metric: str  # what a loss measures (the largest loss over the gated outputs, each by its kind)
    source: str  # which samples were compared, and which calibrated
    samples: int
    loss: float  # the quantized model's loss (as rebuilt)
    noise: float  # its output noise: noise power / signal power, summed over the gated outputs
    rebuilt: bool  # the rebuild has the quantized model's graph and weights exactly
    trials: int
    stopped: str | None  # why the budget ran out before every unit was measured
    units: list[UnitSensitivity]  # by rank
    notes: list[str] = field(default_factory=list)


@dataclass
class Settings:
    """The options the analysis ran with."""

    samples: int | None
    batch_size: int
    runs: int
    warmup: int
    threads: int | None
    latency_batch: int
    worst: int
    layers: bool


@dataclass
class Report:
    float_model: ModelInfo
    quantized_model: ModelInfo
    data: DataInfo
    settings: Settings
    accuracy: Accuracy | None
    fidelity: list[Fidelity]
    reference: list[ReferenceFidelity]
    layers: Layers | None
    speed: Speed | None
    size: Size
    gates: list[GateResult]
    notes: list[str] = field(default_factory=list)
    qcli_version: str = ""
    format: str = FORMAT
    sensitivity: Sensitivity | None = None  # `--sensitivity`
    predicted: Predicted | None = None  # the target profile's latency (None: `verify.latency: measured`)
    decode: Decode | None = None  # a decoder's decode step after the timed prompt
    memory: Memory | None = None  # weights held by onnxruntime (with the prediction), a decoder's cache

    @property
    def passed(self) -> bool:
        """True when every gate passed (or none was set)."""
        return all(g.passed for g in self.gates)

    def gate_error(self):
        """A GateFailed (exit code 1) listing the failed gates, or None when all passed."""
        from qcli.errors import GateFailed

        failed = [g.message for g in self.gates if not g.passed]
        if not failed:
            return None
        return GateFailed("quality gate failed: " + "; ".join(failed))

    def worst_layers(self) -> list[LayerError]:
        return self.layers.worst(self.settings.worst) if self.layers else []

    def to_dict(self) -> dict:
        doc = {"format": self.format, "qcli_version": self.qcli_version, "passed": self.passed}
        for f in dataclasses.fields(self):
            if f.name not in doc:
                doc[f.name] = _plain(getattr(self, f.name))
        return doc

    def to_json(self) -> str:
        """The report as JSON that `read_report` reads back: a character it refuses (a model's
        name with a C1 control character) is written as a \\u escape, the rest as itself."""
        text = json.dumps(self.to_dict(), indent=2, ensure_ascii=False, allow_nan=False)
        return REFUSED.sub(lambda m: f"\\u{ord(m.group()):04x}", text) + "\n"

    @classmethod
    def from_dict(cls, doc: dict) -> Report:
        if doc.get("format") != FORMAT:
            raise QcliError(
                f"not a {FORMAT} report (format: {doc.get('format')!r})",
                hint="read reports written by `qcli analyze --report FILE.json`",
            )
        doc = {k: v for k, v in doc.items() if k != "passed"}
        return _build(cls, doc)


def read_report(path: str | Path) -> Report:
    """Load a JSON report written by `write_report`."""
    path = Path(path)
    text = read_text(path, "report", QcliError)
    try:
        doc = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise QcliError(f"cannot read report {path}: {exc}") from exc
    try:
        return Report.from_dict(doc)
    except (KeyError, TypeError, ValueError) as exc:
        raise QcliError(f"{path} is not a valid {FORMAT} report: {exc}") from exc


def _plain(value):
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _build(tp, value):
    """Rebuild a value of type `tp` (dataclass, list[...], dict[str, ...], X | None) from JSON."""
    if value is None:
        return None
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _build(args[0], value)
    if origin is list:
        (item,) = typing.get_args(tp)
        return [_build(item, v) for v in value]
    if origin is dict:
        _, item = typing.get_args(tp)
        return {k: _build(item, v) for k, v in value.items()}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        known = {f.name for f in dataclasses.fields(tp)}
        unknown = set(value) - known
        if unknown:
            raise ValueError(f"unknown keys for {tp.__name__}: {', '.join(sorted(unknown))}")
        return tp(**{k: _build(hints[k], v) for k, v in value.items()})
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value
