"""SmoothQuant (recovery: [smoothquant]): per-input-channel factors s that move activation outliers
into the weights, Y = (X / s) @ (s W), exact in float.

Decisions (docs/guides/recovery.md, "SmoothQuant"):
- Targets: every activation X read as input 0 by a statically quantized MatMul / Gemm (transA=0)
  / 1x1 Conv (group 1) of `op_types` whose weight is a quantized initializer no other node reads,
  unless X's range is fixed (a YAML `range:`: it describes X, not X / s).
  All smoothed readers of one X share one s (so the division happens once): s_j = max|X_j|^alpha
  / max|W_j|^(1-alpha), the weight max over every reader; a channel never seen non-zero (in X or
  in every W) keeps s_j = 1, and s is clamped to [1e-4, 1e4] so that neither side overflows
  float32 scales.
- 1/s goes into X's producer when every reader of X is smoothed and X is not a graph output nor
  read inside a subgraph: LayerNormalization (scale, bias), a Mul by a per-channel constant,
  MatMul/Gemm/Conv output channels (weight and bias), or an Add of a per-channel constant whose
  other input comes from such a MatMul/Gemm read by nothing else (the bias Add of an export).
  Otherwise an explicit float Mul by the constant 1/s feeds the smoothed readers (rules.SMOOTHING).
- Factors are computed from the original weights, all of them before any change, so folding into
  a producer that is itself smoothed does not depend on the order of the targets.
- Ranges: the smoothed tensor's range is the union of its channels' [min_j / s_j, max_j / s_j]
  (exact minmax of X / s) for every method. A clipping method's range of the unsmoothed X says
  nothing per channel (its clip falls on the outlier channels that smoothing shrinks), and a
  histogram of X / s would need a second pass; after smoothing the outliers are gone, so the
  tensor's minmax is what the clipping methods approach (measured: docs/guides/recovery.md).
- alpha "auto": per target, the candidates "off" (s = 1), 0.0, 0.1, ..., 1.0 are measured on the
  rows the calibration pass sampled (calibrate/channels.py): the error of every reader's output,
  ||Q(X/s) Q(s W) - X W||^2 / ||X W||^2 summed over readers, activations quantized per tensor with
  the range above, weights per output channel; the smallest wins, earlier on a tie ("off" first:
  no Mul for a layer that does not gain). Pure numpy, a few matrix products per candidate.
- Deterministic: the same model, table and config give the same graph (no data read here).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace

import numpy as np
import onnx
from onnx import numpy_helper

from qcli.calibrate.channels import ChannelObserver
from qcli.calibrate.table import CalibrationTable
from qcli.config import Config
from qcli.configparts import SmoothQuant
from qcli.errors import CalibrationError
from qcli.graph import GraphIndex
from qcli.lazy import tensor_array
from qcli.plan import Plan, make_plan
from qcli.rules import SMOOTH_ACTIVATION_AXIS, SMOOTH_FOLDS, SMOOTHING_SUFFIX, block_axis
from qcli.scheme import QuantScheme, choose_qparams, dequantize, quant_dtype, quantize

#: alpha "auto" candidates, after "off" (s = 1).
ALPHAS = tuple(round(0.1 * k, 1) for k in range(11))
#: s is clamped to [1 / S_LIMIT, S_LIMIT].
S_LIMIT = 1e4
_EPS = 1e-8


@dataclass(frozen=True)
class Reader:
    """A smoothed node: its weight, scaled by s along `axis` (its input channels)."""

    node: int
    name: str
    weight: str
    axis: int


@dataclass(frozen=True)
class Fold:
    """Where 1/s goes instead of an explicit Mul: node `node` (`op_type`), its constant inputs
    `scaled` as (input index, axis; None: the constant's last axis); `then`: the producer further
    up that folds too (an Add's MatMul), and `through`: tensors between it and X, whose values
    change too."""

    node: int
    op_type: str
    scaled: tuple[tuple[int, int | None], ...]
    then: Fold | None = None
    through: tuple[str, ...] = ()


@dataclass(frozen=True)
class Target:
    tensor: str
    axis: int  # X's channel axis (negative: from the end)
    readers: tuple[Reader, ...]
    fold: Fold | None
    rank: int  # of the weights' Conv (explicit Mul's constant shape), else 0


@dataclass
class Layer:
    """What was done to one target, for the summary."""

    tensor: str
    readers: list[str]
    alpha: float | None  # None: left unsmoothed (auto measured "off" best)
    into: str  # "LayerNormalization 'ln'", "explicit Mul"
    sqnr_before: float | None = None  # dB, on the sampled rows
    sqnr_after: float | None = None

    def to_dict(self) -> dict:
        return {"tensor": self.tensor, "readers": self.readers, "alpha": self.alpha, "into": self.into,
                "sqnr_before": self.sqnr_before, "sqnr_after": self.sqnr_after}


@dataclass
class Smoothed:
    model: onnx.ModelProto
    table: CalibrationTable  # with the changed tensors' ranges (`derived`)
    layers: list[Layer] = field(default_factory=list)


# ------------------------------------------------------------------ which tensors


def find_targets(model: onnx.ModelProto, config: Config, plan: Plan | None = None,
                 index: GraphIndex | None = None) -> list[Target]:
    """The activations to smooth in the prepared float `model` under `config` (module docstring)."""
    sq = config.recovery.smoothquant
    if sq is None:
        return []
    index = index or GraphIndex.of(model)
    plan = plan or make_plan(model, config, index=index)
    quantized = {d.index for d in plan.nodes if d.quantized and not d.reason and not d.dynamic}
    # a fixed range (a YAML `range:`, or one known without calibration) describes X, not X / s
    fixed = {t for g in plan.groups if g.fixed_range is not None for t in g.tensors}
    activations = set(plan.activations) - fixed
    return targets_of(index, lambda i, node: _reader(i, node, sq.op_types, index, quantized, plan), activations)


def targets_of(index: GraphIndex, reader_of: Callable[[int, onnx.NodeProto], Reader | None],
               activations: Collection[str] | None = None) -> list[Target]:
    """The targets whose readers `reader_of` accepts (all of one X on one channel axis, owning
    their weights), X among `activations` (None: any); each with the fold its producer allows."""
    readers: dict[str, list[Reader]] = {}
    axes: dict[str, set[int]] = {}
    for i, node in enumerate(index.graph.node):
        reader = reader_of(i, node)
        if reader is None or (activations is not None and node.input[0] not in activations):
            continue
        readers.setdefault(node.input[0], []).append(reader)
        axes.setdefault(node.input[0], set()).add(SMOOTH_ACTIVATION_AXIS[node.op_type])
    sub_reads = _subgraph_reads(index.graph)
    targets = []
    for tensor, found in readers.items():
        if len(axes[tensor]) != 1 or not _weights_own(found, index) or tensor in index.initializers:
            continue
        axis = axes[tensor].pop()
        fold = None
        if {r.node for r in found} == set(index.consumers(tensor)) and tensor not in index.outputs \
                and tensor not in sub_reads:
            fold = _fold(tensor, axis, index, _channels(found[0], index))
        rank = len(index.initializers[found[0].weight].dims) if axis >= 0 else 0
        targets.append(Target(tensor, axis, tuple(found), fold, rank))
    return targets


def channel_requests(targets: list[Target]) -> dict[str, int]:
    """Tensor -> channel axis: what the calibration pass keeps per-channel statistics of (each
    target and the tensors its fold changes)."""
    out = {}
    for t in targets:
        out[t.tensor] = t.axis
        fold = t.fold
        while fold is not None:
            out.update({name: t.axis for name in fold.through})
            fold = fold.then
    return out


def _reader(i: int, node: onnx.NodeProto, op_types: Collection[str], index: GraphIndex, quantized: set[int],
            plan: Plan) -> Reader | None:
    if node.op_type not in op_types or node.domain not in ("", "ai.onnx") or i not in quantized:
        return None
    if len(node.input) < 2 or node.input[1] not in index.initializers or node.input[1] not in plan.weights:
        return None
    dims = list(index.initializers[node.input[1]].dims)
    if node.op_type == "MatMul" and len(dims) != 2:
        return None
    if node.op_type == "Gemm" and _attr(node, "transA", 0):
        return None
    if node.op_type == "Conv" and (_attr(node, "group", 1) != 1 or any(d != 1 for d in dims[2:])):
        return None
    axis = block_axis(node, len(dims))
    return None if axis is None else Reader(i, node.name or node.output[0], node.input[1], axis)


def _weights_own(readers: list[Reader], index: GraphIndex) -> bool:
    """Whether no node but these readers reads their weights (a shared weight scaled for one
    activation would be wrong for another)."""
    mine = {r.node for r in readers}
    return all(set(index.consumers(r.weight)) <= mine for r in readers)


def _channels(reader: Reader, index: GraphIndex) -> int:
    return int(index.initializers[reader.weight].dims[reader.axis])


def _fold(tensor: str, axis: int, index: GraphIndex, channels: int) -> Fold | None:
    """Where X's producer can take 1/s (module docstring), or None."""
    j = index.producer(tensor)
    if j is None:
        return None
    node = index.graph.node[j]
    if node.domain not in ("", "ai.onnx") or node.op_type not in SMOOTH_FOLDS or len(node.output) != 1:
        return None
    op = node.op_type
    if op == "LayerNormalization" and axis == -1 and _attr(node, "axis", -1) == -1 and _own(node, j, (1, 2), index):
        return Fold(j, op, ((1, None), (2, None)))
    if op in ("Mul", "Add") and axis == -1:
        k = _channel_constant(node, index, channels)
        if k is None or not _own(node, j, (k,), index):
            return None
        if op == "Mul":
            return Fold(j, op, ((k, None),))
        inner = node.input[1 - k]
        if index.consumers(inner) != [j] or inner in index.outputs:
            return None
        then = _fold(inner, axis, index, channels)
        if then is None or then.op_type not in ("MatMul", "Gemm"):
            return None
        return Fold(j, op, ((k, None),), replace(then, through=(inner,)))
    return _weighted_fold(node, j, axis, index, channels)


def _weighted_fold(node: onnx.NodeProto, j: int, axis: int, index: GraphIndex, channels: int) -> Fold | None:
    """A MatMul / Gemm / Conv producer: its weight's output channels (and bias) take 1/s."""
    op = node.op_type
    if len(node.input) < 2 or node.input[1] not in index.initializers:
        return None
    dims = list(index.initializers[node.input[1]].dims)
    if op == "MatMul" and axis == -1 and len(dims) == 2:
        out_axis = 1
    elif op == "Gemm" and axis == -1:
        out_axis = 0 if _attr(node, "transB", 0) else 1
    elif op == "Conv" and axis == 1:
        out_axis = 0
    else:
        return None
    if dims[out_axis] != channels:
        return None
    scaled: list[tuple[int, int | None]] = [(1, out_axis)]
    if len(node.input) > 2 and node.input[2]:
        bias = index.initializers.get(node.input[2])
        if bias is None or list(bias.dims)[-1:] != [channels]:
            return None
        scaled.append((2, None))
    if not _own(node, j, tuple(k for k, _ in scaled), index):
        return None
    return Fold(j, op, tuple(scaled))


def _channel_constant(node: onnx.NodeProto, index: GraphIndex, channels: int) -> int | None:
    """The input of a binary Mul/Add that is a constant of one value per channel along the last
    axis (shape [..., 1, C] or [C]), or None."""
    for k in (1, 0):
        init = index.initializers.get(node.input[k]) if k < len(node.input) else None
        if init is not None and node.input[1 - k] not in index.initializers:
            dims = list(init.dims)
            if dims and dims[-1] == channels and all(d == 1 for d in dims[:-1]):
                return k
    return None


def _own(node: onnx.NodeProto, j: int, inputs: tuple[int, ...], index: GraphIndex) -> bool:
    """Whether node `j` alone reads its constant inputs `inputs` (those present), and they are
    initializers."""
    for k in inputs:
        if k >= len(node.input) or not node.input[k]:
            continue
        if node.input[k] not in index.initializers or set(index.consumers(node.input[k])) != {j}:
            return False
    return True


def _subgraph_reads(graph: onnx.GraphProto) -> set[str]:
    """Names read by nodes inside any subgraph (If/Loop/Scan bodies), at any depth."""
    names: set[str] = set()
    for node in graph.node:
        for attr in node.attribute:
            for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
                names |= {n for inner in sub.node for n in inner.input} | _subgraph_reads(sub)
    return names


def _attr(node: onnx.NodeProto, name: str, default: int) -> int:
    return next((a.i for a in node.attribute if a.name == name), default)


# ------------------------------------------------------------------ the factors


def factors(x_absmax: np.ndarray, w_absmax: np.ndarray, alpha: float) -> np.ndarray:
    """s_j = max|X_j|^alpha / max|W_j|^(1-alpha), 1 where either is 0, clamped to [1e-4, 1e4].

    >>> factors(np.array([16.0, 1.0, 0.0]), np.array([1.0, 4.0, 2.0]), 0.5).tolist()
    [4.0, 0.5, 1.0]
    """
    x = np.asarray(x_absmax, np.float64)
    w = np.asarray(w_absmax, np.float64)
    live = (x > 0) & (w > 0)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        s = np.where(live, np.maximum(x, _EPS) ** alpha / np.maximum(w, _EPS) ** (1.0 - alpha), 1.0)
    return np.clip(s, 1.0 / S_LIMIT, S_LIMIT).astype(np.float32)


def _matrix(reader: Reader, index: GraphIndex) -> np.ndarray:
    """The reader's weight as a [C_in, C_out] matrix (float64)."""
    w = tensor_array(index.initializers[reader.weight]).astype(np.float64)
    w = np.moveaxis(w, reader.axis, 0)
    return w.reshape(w.shape[0], -1)


def _error(rows: np.ndarray, stats: ChannelObserver, mats: list[np.ndarray], s: np.ndarray,
           act: QuantScheme, wdtype: str) -> float:
    """Sum over readers of ||Q(X/s) Q(s W) - X W||^2 / ||X W||^2 on the sampled rows."""
    assert stats.min is not None and stats.max is not None
    s64 = s.astype(np.float64)
    lo, hi = float(np.min(stats.min / s64)), float(np.max(stats.max / s64))
    scale, zero = choose_qparams(lo, hi, act.dtype, act.symmetric)
    xq = dequantize(quantize(rows / s64, scale, zero, act.dtype, None, act.symmetric), scale, zero).astype(np.float64)
    qw = quant_dtype(wdtype)
    total = 0.0
    for w in mats:
        ws = w * s64[:, None]
        amax = np.abs(ws).max(axis=0)
        wscale, wzero = choose_qparams(-amax, amax, qw, True)
        wq = dequantize(quantize(ws, wscale, wzero, qw, 1, True), wscale, wzero, 1).astype(np.float64)
        ref = rows.astype(np.float64) @ w
        total += float(np.sum((xq @ wq - ref) ** 2) / max(float(np.sum(ref ** 2)), 1e-30))
    return total


def _sqnr(error: float) -> float:
    return round(-10.0 * math.log10(max(error, 1e-30)), 2)


# ------------------------------------------------------------------ the transform


def smooth(model: onnx.ModelProto, config: Config, table: CalibrationTable) -> Smoothed:
    """A smoothed copy of the prepared float `model` (not changed), the table with the changed
    tensors' ranges, and what was done. CalibrationError (exit 2) when `table` lacks the
    per-channel statistics of a target (calibrated without smoothquant)."""
    sq = config.recovery.smoothquant
    assert sq is not None
    index = GraphIndex.of(model)
    plan = make_plan(model, config, index=index)
    targets = find_targets(model, config, plan, index)
    missing = [n for n in channel_requests(targets) if n not in table.channels]
    if missing:
        raise CalibrationError(
            f"the calibration has no per-channel statistics for SmoothQuant (tensor {missing[0]!r})",
            hint="calibrate again with the same --config (recovery: [smoothquant]), or quantize with --data",
        )
    act = QuantScheme.of(table.settings.dtype, symmetric=table.settings.symmetric)
    wdtype = config.weights.dtype if config.weights.dtype in ("int8", "uint8", "int16", "uint16") else "int8"
    chosen = []
    for t in targets:  # every factor from the original weights, before any change
        chosen.append(_choose(t, table.channels[t.tensor], index, sq, act, wdtype))
    out = onnx.ModelProto()
    out.CopyFrom(model)
    derived: dict[str, tuple[float, float]] = {}
    layers = []
    for t, (s, alpha, before, after) in zip(targets, chosen, strict=True):
        into = "left unsmoothed (no alpha lowered the error)" if s is None else _apply(out, t, s, table, derived)
        layers.append(Layer(t.tensor, [r.name for r in t.readers], alpha, into, before, after))
    reorder(out)
    return Smoothed(out, replace(table, derived={**table.derived, **derived}), layers)


def _choose(t: Target, stats: ChannelObserver, index: GraphIndex, sq: SmoothQuant, act: QuantScheme,
            wdtype: str) -> tuple[np.ndarray | None, float | None, float | None, float | None]:
    """(s, alpha, SQNR before, SQNR after) of a target; s None: leave it as it is."""
    mats = [_matrix(r, index) for r in t.readers]
    w_absmax = np.max([np.abs(m).max(axis=1) for m in mats], axis=0)
    rows = stats.rows.astype(np.float64)
    measured = len(rows) > 0
    ones = np.ones(len(w_absmax), np.float32)
    base = _error(rows, stats, mats, ones, act, wdtype) if measured else None
    if sq.alpha != "auto":
        s = factors(stats.absmax, w_absmax, float(sq.alpha))
        after = _error(rows, stats, mats, s, act, wdtype) if measured else None
        return s, float(sq.alpha), _maybe_sqnr(base), _maybe_sqnr(after)
    best: tuple[float, np.ndarray | None, float | None] = (base if base is not None else math.inf, None, None)
    for alpha in ALPHAS:
        s = factors(stats.absmax, w_absmax, alpha)
        err = _error(rows, stats, mats, s, act, wdtype) if measured else math.inf
        if err < best[0]:
            best = (err, s, alpha)
    return best[1], best[2], _maybe_sqnr(base), _maybe_sqnr(best[0] if best[1] is not None else base)


def _maybe_sqnr(error: float | None) -> float | None:
    return None if error is None or not math.isfinite(error) else _sqnr(error)


def _apply(model: onnx.ModelProto, t: Target, s: np.ndarray, table: CalibrationTable,
           derived: dict[str, tuple[float, float]]) -> str:
    """Scale the readers' weights by s, divide X by s (fold or explicit Mul); note the changed
    tensors' ranges in `derived`. Returns where the division went."""
    inits = {i.name: i for i in model.graph.initializer}
    for weight, axis in dict.fromkeys((r.weight, r.axis) for r in t.readers):
        scale_initializer(inits[weight], s, axis)
    into, changed = divide(model, t, s, lambda name, factor, axis: scale_initializer(inits[name], factor, axis))
    for name in changed:  # an explicit Mul's output: X's channels divided
        derived[name] = _range(table.channels[name if name in table.channels else t.tensor], s)
    return into


def divide(model: onnx.ModelProto, t: Target, s: np.ndarray, scale: Callable[[str, np.ndarray, int], None],
           step: str = "smoothquant") -> tuple[str, list[str]]:
    """X / s for t's readers: 1/s folded into X's producer's constants (each scaled by
    `scale(initializer, factor, axis)`), or an explicit Mul before the readers. Returns where the
    division went and the tensors whose values changed (the Mul's output, or X and the tensors
    between it and the folded producer)."""
    inverse = (1.0 / s.astype(np.float64)).astype(np.float32)
    if t.fold is None:
        return "explicit Mul", [_explicit_mul(model, t, inverse, step)]
    fold: Fold | None = t.fold
    names, changed = [], [t.tensor]
    while fold is not None:
        node = model.graph.node[fold.node]
        for k, along in fold.scaled:
            if k < len(node.input) and node.input[k]:
                scale(node.input[k], inverse, -1 if along is None else along)
        names.append(f"{fold.op_type} {node.name or node.output[0]!r}")
        changed += fold.through
        fold = fold.then
    return " + ".join(names), changed


def _range(stats: ChannelObserver, s: np.ndarray) -> tuple[float, float]:
    """The range of X / s: the union of the channels' [min_j / s_j, max_j / s_j]."""
    assert stats.min is not None and stats.max is not None
    s64 = s.astype(np.float64)
    return float(np.min(stats.min / s64)), float(np.max(stats.max / s64))


def scale_initializer(init: onnx.TensorProto, factor: np.ndarray, axis: int) -> None:
    """Multiply an initializer by `factor` along `axis` (negative: from the end), in place."""
    values = tensor_array(init)
    shape = [1] * values.ndim
    shape[axis] = -1
    scaled = (values.astype(np.float32) * factor.reshape(shape)).astype(values.dtype)
    init.CopyFrom(numpy_helper.from_array(scaled, init.name))


def _explicit_mul(model: onnx.ModelProto, t: Target, inverse: np.ndarray, step: str) -> str:
    """X -> Mul(X, 1/s) (named for `step`) -> the readers; returns the smoothed tensor's name."""
    graph = model.graph
    const, smoothed = f"{t.tensor}{SMOOTHING_SUFFIX}", f"{t.tensor}_smoothed"
    shape = [len(inverse)] + [1] * (t.rank - 2) if t.axis >= 0 else [len(inverse)]
    graph.initializer.append(numpy_helper.from_array(inverse.reshape(shape), const))
    for r in t.readers:
        graph.node[r.node].input[0] = smoothed
    graph.node.append(onnx.helper.make_node("Mul", [t.tensor, const], [smoothed], name=f"{t.tensor}_{step}"))
    info = next((v for v in [*graph.value_info, *graph.input] if v.name == t.tensor), None)
    if info is not None:
        copy = onnx.ValueInfoProto()
        copy.CopyFrom(info)
        copy.name = smoothed
        graph.value_info.append(copy)
    return smoothed


def reorder(model: onnx.ModelProto) -> None:
    """Put the appended Mul nodes right before their first reader (graph order stays topological)."""
    graph = model.graph
    muls = [n for n in graph.node if n.op_type == "Mul" and len(n.input) == 2 and n.input[1].endswith(SMOOTHING_SUFFIX)]
    if not muls:
        return
    pending = {n.output[0]: n for n in muls}
    moved = set(pending)
    ordered = []
    for node in graph.node:
        if node.output[:1] and node.output[0] in moved:
            continue
        for name in node.input:
            mul = pending.pop(name, None)
            if mul is not None:
                ordered.append(mul)
        ordered.append(node)
    ordered += pending.values()
    copies = [onnx.NodeProto() for _ in ordered]
    for copy, node in zip(copies, ordered, strict=True):
        copy.CopyFrom(node)
    del graph.node[:]
    graph.node.extend(copies)
