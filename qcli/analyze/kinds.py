"""What each model output is, so it is compared by a metric that means something for it.

The kind of an output is decided once, from the graph (the op that computes it, looking through
data movement) and from the float model's values on the compared samples, in this order:

1. `verify.outputs` names it: that kind.
2. Not float (class ids, token ids, bool masks): `per_element`, the share of elements equal.
2a. Decoded boxes with class scores (`[N, 4 + C, A]` or `[N, A, 4 + C]`: centre and size in
   pixels, then probabilities; qcli.analyze.boxes.box_layout): `boxes`, each sample's detections
   (score >= 0.25 or `verify.thresholds`, suppressed per class) matched at IoU 0.5.
3. A recurrent state (an LSTM/GRU/RNN Y_h or Y_c, or the shape of a float input named like a
   state: `state`, `hidden`, `h0`, `c0`...): `ignore`, reported and never gated: the next call's
   outputs, not this one's, show what its error does.
4. Sigmoid: independent probabilities (multi-label scores `[N, C]`, one per sample, per frame
   or per pixel) are a `mask`: thresholded at 0.5 or `verify.thresholds`, and judged by the IoU
   of the positives (the labels or pixels "on"), never by the share of elements agreeing, which
   a sparse map's background fills.
5. Softmax or LogSoftmax (also written out as Exp / ReduceSum(Exp)): `[N, C]` is `top1`,
   `[N, T, C]` or `[T, N, C]` a `sequence`, rank 4 a per-pixel class map: a `mask` whose pixels'
   classes are the argmax over the class axis (1, or 3 when it is the smaller), judged by the
   mean IoU of the classes either model's map has (a small class counts as much as the
   background; pixels agreeing are reported).
5b. Upsampled by Resize or Upsample, rank 4 with 2 to MAX_CLASSES channels: segmentation
   logits, a per-pixel class map as in 5 (a detector's raw heads and a backbone's features are
   not upsampled at the end).
5a. A dense one-channel map (`[N, 1, H, W]` or `[N, H, W, 1]`, at least 64 elements): of
   probabilities, a `mask`; else a `map` (saliency, a heat-map): the IoU of the two models' top
   regions (each one's highest tenth of its values) and the PSNR.
6. One value per sample within [0, 1] (a detector's decision): a `mask`; any other one value per
   sample (a score, an age, a quality rating) a `regression`: its error relative to its spread
   over the compared samples.
7. A trailing normalization (LpNormalization, a Div by ReduceL2 / Sqrt / a norm) or pooling
   (ReduceMean, GlobalAveragePool, a Div of a ReduceSum: mean over tokens) of more than one value
   per sample: `cosine`, an embedding.
8. Rows of unit norm (every `[N, D]` row within 1e-3 of 1): `cosine`.
9. A final linear layer with a bias (Gemm, MatMul + Add), not normalized or pooled after:
   `[N, C]` is `top1`, `[N, T, C]` a `sequence` (a tagger's or a CTC head's logits). A bias-less
   final MatMul on `[N, T, D]` is as often a projection of hidden states: rule 10.
9a. `[N, C]` with 2 <= C <= 16, every value above 0 on every sample, rows not summing to 1:
   `regression` (several scores or measurements: a speech-quality model's three mean opinion
   scores), where a classifier's logits take both signs.
1a. In a decoder (an input `input_ids` and past key/value inputs or `present*` outputs): the key/
   value cache it returns (`present*`) is `ignore`, as a recurrent state; float `[N, T, V]`
   logits are `tokens`, judged by perplexity on the text's next tokens (qcli.analyze.tokens).
10. Otherwise `[N, C]` is `top1` (class scores, as before kinds existed) and every other float
   output `cosine` (feature maps, hidden states, regressions).

A sequence's blank (CTC) is `verify.ctc_blank`, else detected: class 0 or the last class when it
is the argmax of most positions in the float outputs (a CTC head predicts blank between
characters); with a blank, sequences are compared after CTC collapse. `verify.sequence_trim`
names classes that do not count at either end of a sequence (an OCR line's spaces: the float
model itself hesitates between blank and space in a crop's margins).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import Enum

import numpy as np
import onnx

from qcli.analyze.boxes import DEFAULT_THRESHOLD, box_layout
from qcli.errors import ConfigError


class Kind(str, Enum):
    TOP1 = "top1"  # class scores: argmax over the last axis agrees
    SEQUENCE = "sequence"  # class scores per position: the whole argmax sequence agrees
    COSINE = "cosine"  # embeddings, feature maps: mean per-sample cosine
    MASK = "mask"  # probability / score maps, multi-label scores: the IoU of the thresholded positives
    REGRESSION = "regression"  # a few values per sample (scores, coordinates): error relative to their spread
    MAP = "map"  # a dense one-channel map (saliency, heat-map): IoU of the top regions, PSNR
    BOXES = "boxes"  # a detector's decoded boxes with class scores: boxes matched at IoU 0.5 (qcli.analyze.boxes)
    PER_ELEMENT = "per_element"  # integer / bool outputs: the share of elements equal
    IGNORE = "ignore"  # recurrent state: reported, not gated
    TOKENS = "tokens"  # a language model's logits: perplexity on the next tokens (qcli.analyze.tokens)


@dataclass(frozen=True)
class OutputKind:
    kind: Kind
    reason: str
    blank: int | None = None  # sequence: the CTC blank class (collapse before comparing)
    trim: tuple[int, ...] = ()  # sequence: classes that do not count at either end (verify.sequence_trim)
    threshold: float | None = None  # mask: values above it are "on"; boxes: the score a detection needs
    axis: int | None = None  # boxes: the attributes' axis of a batch (1 or 2)
    classes: int | None = None  # mask: a per-pixel class map's class axis, compared by its argmax


# Ops that move or reshape data without computing: an output's meaning is its producer's.
DATA_MOVEMENT = frozenset({
    "Identity", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Cast", "Slice", "Gather",
    "Concat", "Expand", "Split", "Tile", "CastLike", "DepthToSpace", "SpaceToDepth",
})
RECURRENT = frozenset({"LSTM", "GRU", "RNN"})
SOFTMAX = frozenset({"Softmax", "LogSoftmax"})
NORMS = frozenset({"LpNormalization", "ReduceL2", "Sqrt", "ReduceSumSquare"})
POOLS = frozenset({"ReduceMean", "ReduceSum", "GlobalAveragePool", "GlobalMaxPool", "ReduceMax"})
LINEAR = frozenset({"Gemm", "MatMul"})
UPSAMPLING = frozenset({"Resize", "Upsample"})
MAX_CLASSES = 256  # an upsampled map with 2 to this many channels is a class map (rule 5b)
# Ops a norm's divisor passes through: clamping away from 0, adding epsilon, broadcasting.
_DIVISOR_WRAPPERS = DATA_MOVEMENT | {"Clip", "Max", "Add", "Pow"}
_STATE_NAME = re.compile(r"(state|hidden|^[hc]\d*$|^[hc]_|_[hc]\d*$|^h[nx]$|^c[nx]$)", re.IGNORECASE)
UNIT_NORM_TOLERANCE = 1e-3
MAX_SCORES = 16  # at most this many values per sample are read as several scores (rule 9a)


class _Graph:
    """Producers of the main graph's tensors (an If's outputs read through its then-branch)."""

    def __init__(self, graph: onnx.GraphProto):
        self.producer: dict[str, tuple[onnx.NodeProto, int]] = {}
        self._add(graph)

    def _add(self, graph: onnx.GraphProto) -> None:
        for node in graph.node:
            for i, out in enumerate(node.output):
                self.producer[out] = (node, i)
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    self._add(attr.g)

    def source(self, name: str) -> tuple[onnx.NodeProto, int] | None:
        """The node computing `name`, looking through data movement and If branches."""
        seen = set()
        while name in self.producer and name not in seen:
            seen.add(name)
            node, index = self.producer[name]
            if node.op_type == "If":
                branch = next(a.g for a in node.attribute if a.name == "then_branch")
                name = branch.output[index].name
            elif node.op_type in DATA_MOVEMENT and node.input and node.input[0]:
                name = node.input[0]
            else:
                return node, index
        return None

    def op(self, name: str) -> str | None:
        found = self.source(name)
        return found[0].op_type if found else None


def _evidence(graph: _Graph, name: str) -> tuple[str, str] | None:
    """(what computes the output, in words; the rule it points to) from the graph, or None."""
    found = graph.source(name)
    if found is None:
        return None
    node, index = found
    op, at = node.op_type, f" {node.name!r}" if node.name else ""
    if op in RECURRENT and index in (1, 2):
        return f"the {('Y_h', 'Y_c')[index - 1]} state output of {op}{at}", "state"
    if op in ("Sigmoid", "HardSigmoid"):
        return f"computed by {op}{at}", "sigmoid"
    if op in SOFTMAX:
        return f"computed by {op}{at}", "softmax"
    if op in UPSAMPLING:
        return f"upsampled by {op}{at}", "upsampled"
    if op == "LpNormalization":
        return f"normalized by LpNormalization{at}", "embedding"
    if op == "Div" and len(node.input) == 2:
        top, bottom = graph.op(node.input[0]), _divisor(graph, node.input[1])
        if top == "Exp":
            return f"Exp / ReduceSum (a written-out softmax){at and ' at' + at}", "softmax"
        if bottom in NORMS:
            return f"divided by its norm ({bottom}){at and ' at' + at}", "embedding"
        if top in POOLS:
            return f"pooled: {top} divided by a count{at and ' at' + at}", "embedding"
    if op in POOLS:
        return f"pooled by {op}{at}", "embedding"
    if op == "Gemm" or (op == "Add" and any(graph.op(i) in LINEAR for i in node.input)):
        return f"a final linear layer with a bias ({op}{at})", "linear"
    if op == "MatMul":
        return f"a final MatMul{at}", "matmul"
    return None


def _divisor(graph: _Graph, name: str) -> str | None:
    """The op a divisor comes from, looking through clamps, epsilons and broadcasts."""
    seen = set()
    while name in graph.producer and name not in seen:
        seen.add(name)
        node, _ = graph.producer[name]
        if node.op_type not in _DIVISOR_WRAPPERS or not node.input:
            return node.op_type
        name = node.input[0]
    return None


def _state_input(model: onnx.ModelProto, value: np.ndarray) -> str | None:
    """A float graph input named like a recurrent state whose shape the output has."""
    for i in model.graph.input:
        t = i.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
        if (t.elem_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16) and _STATE_NAME.search(i.name)
                and len(dims) == value.ndim >= 2
                and all(d is None or d == s for d, s in zip(dims, value.shape, strict=True))):
            return i.name
    return None


def _unit_rows(values: Sequence[np.ndarray]) -> bool:
    """Every row of these `[N, D]` float batches has norm 1 (within UNIT_NORM_TOLERANCE)."""
    for v in values:
        norms = np.linalg.norm(np.asarray(v, dtype=np.float64), axis=1)
        if not (norms.size and np.all(np.abs(norms - 1.0) <= UNIT_NORM_TOLERANCE)):
            return False
    return True


# float32 rounding: onnxruntime's Sigmoid gives 1.0000001 on large inputs
_ROUNDING = 1e-6


def _probabilities(values: Sequence[np.ndarray]) -> bool:
    return all(v.size == 0 or (float(np.min(v)) >= -_ROUNDING and float(np.max(v)) <= 1.0 + _ROUNDING)
               for v in values)


def _positive(values: Sequence[np.ndarray]) -> bool:
    """Every value above 0 on every sample and no row summing to 1: a few scores or measurements
    (mean opinion scores, sizes), where a classifier's logits take both signs."""
    return all(v.size and float(np.min(v)) > 0 and not np.allclose(np.sum(v, axis=-1), 1.0, atol=1e-3)
               for v in values)


def _one_channel_map(value: np.ndarray) -> bool:
    """`[N, 1, H, W]` or `[N, H, W, 1]` with at least 64 elements a sample."""
    return value.ndim == 4 and 1 in (value.shape[1], value.shape[3]) and value[0].size >= 64


def mask_threshold(values: Sequence[np.ndarray]) -> float:
    """The default threshold of a mask: 0.5 for probabilities (values within [0, 1], up to
    float32 rounding), else 0 (the logit of 0.5).

    >>> mask_threshold([np.array([0.0, 0.3, 1.0000001], np.float32)]), mask_threshold([np.array([-2.0, 3.0])])
    (0.5, 0.0)
    """
    return 0.5 if _probabilities(values) else 0.0


def ctc_blank(values: Sequence[np.ndarray]) -> int | None:
    """Class 0 or the last class when it is the argmax of most positions (a CTC head's blank).

    >>> x = np.zeros((1, 5, 3)); x[0, [0, 1, 3], 0] = 1; x[0, 2, 1] = 1; x[0, 4, 2] = 1
    >>> ctc_blank([x])
    0
    >>> ctc_blank([x[:, :, ::-1]])
    2
    """
    counts = None
    for v in values:
        ids = np.asarray(v).argmax(axis=-1).ravel()
        c = np.bincount(ids, minlength=np.asarray(v).shape[-1])
        counts = c if counts is None else counts + c
    if counts is None or counts.sum() == 0:
        return None
    top = int(counts.argmax())
    return top if top in (0, counts.size - 1) and counts[top] * 2 > counts.sum() else None


def decide(name: str, values: Sequence[np.ndarray], evidence: tuple[str, str] | None, state_input: str | None,
           blank: int | None = None, threshold: float | None = None) -> OutputKind:
    """The kind of one output from its float values (batches) and the graph's evidence (module
    docstring, rules 2-10); `blank`: the configured CTC blank; `threshold`: a mask's, configured."""
    first = np.asarray(values[0])
    if not np.issubdtype(first.dtype, np.floating):
        return OutputKind(Kind.PER_ELEMENT, f"{first.dtype} values: compared element by element")
    why, rule = evidence if evidence else ("", "")
    shape = "[" + ", ".join(str(s) for s in first.shape) + "]"
    if rule == "state":
        return OutputKind(Kind.IGNORE, f"{why}: a recurrent state, reported but not gated")
    if state_input is not None:
        return OutputKind(Kind.IGNORE, f"the shape of the state input {state_input!r}: a recurrent state fed back, "
                                       "reported but not gated")
    if (axis := box_layout(values)) is not None:
        return _boxes(f"{shape} decoded boxes with class scores (attributes on axis {axis})", axis, threshold)
    classes = first.ndim == 2 and first.shape[1] >= 2
    if rule == "sigmoid":
        if classes:
            return _mask(f"{why}: {shape} independent sigmoids (multi-label scores)", values, threshold)
        return _mask(f"{why}: {shape} probabilities", values, threshold)
    if rule == "softmax":
        if first.ndim == 3:
            return _sequence(f"{why}: {shape} class scores per position", values, blank)
        if first.ndim == 4:
            return _class_map(name, f"{why}: a {shape} per-pixel class map", first, threshold)
        if classes:
            return OutputKind(Kind.TOP1, f"{why}: {shape} class scores")
    if rule == "upsampled" and first.ndim == 4 and 2 <= first.shape[_class_axis(first)] <= MAX_CLASSES:
        return _class_map(name, f"{why}: a {shape} per-pixel class map (segmentation logits)", first, threshold)
    if _one_channel_map(first):
        if _probabilities(values):
            return _mask(f"{why + ': ' if why else ''}a {shape} map of probabilities", values, threshold)
        return OutputKind(Kind.MAP, f"{why + ': ' if why else ''}a {shape} dense map: the IoU of its top tenth")
    if first.ndim >= 1 and first.size == first.shape[0] and _probabilities(values):
        return _mask(f"{why + ': ' if why else ''}one probability per sample {shape}", values, threshold)
    if first.ndim >= 1 and first.size == first.shape[0]:
        return OutputKind(Kind.REGRESSION, f"{why + ': ' if why else ''}one value per sample {shape}, not a "
                                           "probability: a regression")
    if rule == "embedding" and first.size > max(first.shape[0], 1) and first.ndim >= 2:
        return OutputKind(Kind.COSINE, f"{why}: {shape} embedding")
    if classes and _unit_rows(values):
        return OutputKind(Kind.COSINE, f"{shape} rows of unit norm: an embedding")
    if rule == "linear" and first.ndim == 3 and first.shape[2] >= 2:  # a bias-less MatMul may project hidden states
        return _sequence(f"{why}: {shape} class scores per position", values, blank)
    if classes and first.shape[1] <= MAX_SCORES and _positive(values):
        return OutputKind(Kind.REGRESSION, f"{why + ': ' if why else ''}{shape} values above 0 on every sample, not "
                                           "probabilities: scores or measurements, not logits (name it top1 in "
                                           "verify.outputs if these are class scores)")
    if classes:
        return OutputKind(Kind.TOP1, f"{why}: {shape} class scores" if why else f"{shape} float: class scores")
    return OutputKind(Kind.COSINE, f"{why}: {shape} float values" if why else f"{shape} float values")


def _sequence(reason: str, values: Sequence[np.ndarray], blank: int | None) -> OutputKind:
    if blank is not None:
        return OutputKind(Kind.SEQUENCE, f"{reason}; CTC blank {blank} (verify.ctc_blank)", blank=blank)
    found = ctc_blank(values)
    if found is not None:
        return OutputKind(Kind.SEQUENCE, f"{reason}; CTC blank {found} (the argmax of most positions)", blank=found)
    return OutputKind(Kind.SEQUENCE, reason)


def _mask(reason: str, values: Sequence[np.ndarray], threshold: float | None) -> OutputKind:
    """A mask kind, thresholded where `verify.thresholds` says, else by `mask_threshold`, with why."""
    if threshold is not None:
        return OutputKind(Kind.MASK, f"{reason}; masks thresholded at {threshold:g} (verify.thresholds)",
                          threshold=threshold)
    threshold = mask_threshold(values)
    why = "probabilities" if threshold == 0.5 else "logits: the logit of 0.5"
    return OutputKind(Kind.MASK, f"{reason}; masks thresholded at {threshold:g} ({why}; verify.thresholds sets "
                                 "another)", threshold=threshold)


def _class_axis(value: np.ndarray) -> int:
    """A rank-4 class map's class axis: 1 (channels first), or 3 when the last axis is the
    smaller (channels last)."""
    return 3 if value.shape[3] < value.shape[1] else 1


def _class_map(name: str, reason: str, value: np.ndarray, threshold: float | None) -> OutputKind:
    """A per-pixel class map: each pixel's class the argmax over the class axis, judged by the
    mean IoU of the classes (a small class counts as much as the background)."""
    if threshold is not None:
        raise ConfigError(f"verify.thresholds: output {name!r} is {reason}: compared by each pixel's class (the "
                          "argmax), so a threshold does not apply",
                          hint="drop its threshold, or name it `mask` in verify.outputs to judge each channel "
                               "thresholded")
    axis = _class_axis(value)
    return OutputKind(Kind.MASK, f"{reason}; each pixel's class the argmax over axis {axis}, judged by the mean "
                                 "IoU of the classes", classes=axis)


def _boxes(reason: str, axis: int, threshold: float | None) -> OutputKind:
    if threshold is not None:
        return OutputKind(Kind.BOXES, f"{reason}; detections scoring {threshold:g} (verify.thresholds)",
                          threshold=threshold, axis=axis)
    return OutputKind(Kind.BOXES, f"{reason}; detections scoring {DEFAULT_THRESHOLD:g} (YOLO's; verify.thresholds "
                                  "sets another)", threshold=DEFAULT_THRESHOLD, axis=axis)


def forced(name: str, kind: Kind, values: Sequence[np.ndarray], blank: int | None,
           threshold: float | None = None) -> OutputKind:
    """The kind `verify.outputs` names, with its blank or threshold; a ConfigError for a float
    metric on integer values."""
    first = np.asarray(values[0])
    if not np.issubdtype(first.dtype, np.floating) and kind not in (Kind.PER_ELEMENT, Kind.IGNORE):
        raise ConfigError(f"verify.outputs: output {name!r} holds {first.dtype} values: {kind.value} does not apply",
                          hint="integer and bool outputs are per_element or ignore")
    why = f"verify.outputs says {kind.value}"
    if kind is Kind.SEQUENCE:
        return _sequence(why, values, blank)
    if kind is Kind.MASK:
        return _mask(why, values, threshold)
    if kind is Kind.BOXES:
        axis = box_layout(values)
        if axis is None:
            raise ConfigError(f"verify.outputs: output {name!r} does not hold decoded boxes with class scores",
                              hint="boxes reads [N, 4 + C, A] or [N, A, 4 + C]: centre x, y, width and height in "
                                   "pixels, then one probability per class")
        return _boxes(why, axis, threshold)
    return OutputKind(kind, why)


def check_outputs(model: onnx.ModelProto, named: Mapping[str, object], key: str = "verify.outputs") -> None:
    """A ConfigError when `key` (verify.outputs, verify.thresholds) names an output the model
    does not have."""
    names = [o.name for o in model.graph.output]
    unknown = [n for n in named if n not in names]
    if unknown:
        raise ConfigError(f"{key}: the model has no output {unknown[0]!r}",
                          hint="its outputs: " + ", ".join(repr(n) for n in names))


def _check_blank(name: str, classes: int, blank: int | None) -> None:
    """A ConfigError when `verify.ctc_blank` is not one of the sequence output's `classes` (its
    last axis). `verify.sequence_trim` may name classes an output lacks: every sequence output
    gets it, and a class it lacks never shows."""
    if blank is not None and not 0 <= blank < classes:
        raise ConfigError(f"verify.ctc_blank: class {blank} is not a class of output {name!r}, whose last axis "
                          f"holds {classes} (0-{classes - 1})",
                          hint="give one of its classes, or drop verify.ctc_blank")


def _decoder(model: onnx.ModelProto) -> bool:
    """Rule 1a's decoder: an input `input_ids`, and past key/value inputs or `present*` outputs."""
    inputs = {i.name for i in model.graph.input}
    cached = any("past" in i for i in inputs) or any(o.name.startswith("present") for o in model.graph.output)
    return "input_ids" in inputs and cached


def cache_outputs(model: onnx.ModelProto) -> list[str]:
    """A decoder's key/value cache outputs (`present*`): never gated, so a verification's probe
    need not hold them (a 24-layer decoder's, 25 MB a chunk of 128 tokens)."""
    return [o.name for o in model.graph.output if o.name.startswith("present")] if _decoder(model) else []


def _decoder_output(model: onnx.ModelProto, name: str, value: np.ndarray) -> OutputKind | None:
    """Rule 1a: a decoder's key/value cache or its logits, else None."""
    if not _decoder(model) or not np.issubdtype(value.dtype, np.floating):
        return None
    if name.startswith("present"):
        return OutputKind(Kind.IGNORE, "the key/value cache a decoder returns (the next step's logits show its "
                                       "error)")
    if value.ndim == 3 and value.shape[2] >= 2:
        shape = "[" + ", ".join(str(s) for s in value.shape) + "]"
        return OutputKind(Kind.TOKENS, f"{shape} logits over {value.shape[2]} tokens at each position of a decoder "
                                       "fed input_ids: judged by perplexity on the next tokens")
    return None


def output_kinds(model: onnx.ModelProto, values: Mapping[str, Sequence[np.ndarray]],
                 named: Mapping[str, str] | None = None, blank: int | None = None,
                 trim: Sequence[int] = (), thresholds: Mapping[str, float] | None = None) -> dict[str, OutputKind]:
    """The kind of every output in `values` (its float batches); `named`: `verify.outputs`;
    `trim`: `verify.sequence_trim`, given to every sequence output; `thresholds`:
    `verify.thresholds`, each for a mask output."""
    named, thresholds = named or {}, thresholds or {}
    check_outputs(model, named)
    check_outputs(model, thresholds, "verify.thresholds")
    graph = _Graph(model.graph)
    kinds = {}
    for name, batches in values.items():
        threshold = thresholds.get(name)
        if name in named:
            kinds[name] = forced(name, Kind(named[name]), batches, blank, threshold)
        elif (found := _decoder_output(model, name, batches[0])) is not None:
            kinds[name] = found
        else:
            kinds[name] = decide(name, batches, _evidence(graph, name), _state_input(model, batches[0]), blank,
                                 threshold)
        if threshold is not None and kinds[name].kind not in (Kind.MASK, Kind.BOXES):
            raise ConfigError(f"verify.thresholds: output {name!r} is judged as {kinds[name].kind.value} "
                              f"({kinds[name].reason}), not as a mask: a threshold does not apply",
                              hint=f"add `verify.outputs: {{{name}: mask}}` to judge it by thresholded labels, "
                                   "or drop its threshold")
        if kinds[name].kind is Kind.SEQUENCE:
            _check_blank(name, batches[0].shape[-1], blank)
            if trim:
                ends = ", ".join(str(c) for c in trim)
                kinds[name] = replace(kinds[name], trim=tuple(trim),
                                      reason=f"{kinds[name].reason}; class {ends} not counted at either end "
                                             "(verify.sequence_trim)")
    return kinds
