"""Fold inference-mode BatchNormalization into the Conv, ConvTranspose or Gemm before it:

    BatchNormalization(Conv(X, W, b), gamma, beta, mean, var)
        -> Conv(X, W * s, (b - mean) * s + beta)         s = gamma / sqrt(var + epsilon)

with `s` applied along the producer's output-channel axis: axis 0 of a Conv weight, axis 1
of a ConvTranspose weight (per group), the N axis of a Gemm's B (axis 1, or 0 with transB).
The producer then writes the BatchNormalization's output name and keeps its own node name.

A BatchNormalization stays (and a note says why) unless: it has one output and no training
mode, its four parameters are initializers, its input comes from such a producer in the
default domain, that producer's output feeds nothing else and is not a graph output, and the
producer's weight (and bias, if any) are floating-point initializers of matching size.
Main graph only. A weight shared with another node is not rewritten in place: the producer
gets a folded copy named `<weight>/folded`.

The weight arithmetic (`scale_and_shift`: make a producer compute `out * s + t` per output
channel) is shared with `canonicalize`, which folds per-channel Mul/Add the same way.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
from onnx import helper

from qcli.lazy import tensor_array
from qcli.prepare._graph import (
    NameAllocator,
    Options,
    PassResult,
    add_initializer,
    is_default_domain,
    label,
    plural,
    prune_value_info,
    remove_nodes,
    remove_unused_initializers,
    set_tensor,
    tensor_names,
    use_counts,
)

PRODUCERS = ("Conv", "ConvTranspose", "Gemm")
FLOAT_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE)


def fold_batchnorm(model: onnx.ModelProto, options: Options = Options()) -> PassResult:
    graph = model.graph
    initializers = {t.name: t for t in graph.initializer}
    producers = {o: node for node in graph.node for o in node.output if o}
    uses = use_counts(graph)
    names = NameAllocator(tensor_names(graph))
    folded: Counter[str] = Counter()
    kept: list[str] = []
    doomed: list[int] = []
    for index, bn in enumerate(graph.node):
        if bn.op_type != "BatchNormalization" or not is_default_domain(bn):
            continue
        producer = producers.get(bn.input[0])
        reason = why_not_folded(bn, producer, initializers, uses)
        if reason is None:
            assert producer is not None  # why_not_folded gives a reason when there is none
            reason = _fold(bn, producer, initializers, uses, names, graph)
            if reason is None:
                folded[producer.op_type] += 1
                doomed.append(index)
                continue
        kept.append(f"{label(bn)} not folded: {reason}")
    remove_nodes(graph, doomed)
    notes = []
    if folded:
        total = sum(folded.values())
        into = ", ".join(f"{op} ({n})" for op, n in sorted(folded.items())) if len(folded) > 1 else next(iter(folded))
        others = f" ({len(kept)} others not folded)" if kept else ""
        notes.append(f"folded {plural(total, 'BatchNormalization node')} into {into}{others}")
        remove_unused_initializers(graph)
        prune_value_info(graph)
    return PassResult(model, bool(folded), notes + kept)


def why_not_folded(
    bn: onnx.NodeProto,
    producer: onnx.NodeProto | None,
    initializers: dict[str, onnx.TensorProto],
    uses: Counter[str],
) -> str | None:
    """Why this BatchNormalization cannot be folded into its producer (None: it can)."""
    if len([o for o in bn.output if o]) != 1:
        return "it has training outputs (running mean/var)"
    if any(a.name == "training_mode" and a.i for a in bn.attribute):
        return "it runs in training mode"
    for name in bn.input[1:5]:
        if name not in initializers:
            return f"its parameter '{name}' is not a constant"
    source = bn.input[0]
    if producer is None:
        what = "an initializer" if source in initializers else "a graph input"
        return f"its input '{source}' is {what}"
    if producer.op_type not in PRODUCERS or not is_default_domain(producer):
        return f"its input comes from {producer.op_type}"
    if uses[source] > 1:
        return f"the output of {label(producer)} also feeds other nodes or is a graph output"
    for role, position in (("weight", 1), ("bias", 2)):
        if len(producer.input) > position and producer.input[position]:
            name = producer.input[position]
            if name not in initializers:
                return f"the {role} of {label(producer)} is not a constant"
            if initializers[name].data_type not in FLOAT_TYPES:
                return f"the {role} of {label(producer)} is not floating point"
    return None


def _fold(
    bn: onnx.NodeProto,
    producer: onnx.NodeProto,
    initializers: dict[str, onnx.TensorProto],
    uses: Counter[str],
    names: NameAllocator,
    graph: onnx.GraphProto,
) -> str | None:
    """Rewrite the producer's weight and bias; None when done, else why it was not."""
    gamma, beta, mean, var = (tensor_array(initializers[n]).astype(np.float64) for n in bn.input[1:5])
    epsilon = next((a.f for a in bn.attribute if a.name == "epsilon"), 1e-5)
    channels = gamma.size
    if not (gamma.shape == beta.shape == mean.shape == var.shape == (channels,)):
        return "its parameters are not 1-D of one size"
    found = output_channels(producer, initializers)
    if found != channels:
        return f"it has {channels} channels but {label(producer)} has {found or 0} output channels"
    scale = gamma / np.sqrt(var + epsilon)
    reason = scale_and_shift(producer, scale, beta - mean * scale, initializers, uses, names, graph)
    if reason is None:
        producer.output[0] = bn.output[0]
    return reason


def output_channels(producer: onnx.NodeProto, initializers: dict[str, onnx.TensorProto]) -> int | None:
    """How many channels the producer's output has on axis 1 (Conv, ConvTranspose,
    BatchNormalization) or on its last axis (Gemm's N), from its constant weight; None when
    the weight does not have a shape the op allows."""
    attrs = {a.name: helper.get_attribute_value(a) for a in producer.attribute}
    if producer.op_type == "BatchNormalization":
        dims = list(initializers[producer.input[1]].dims)
        return dims[0] if len(dims) == 1 else None
    dims = list(initializers[producer.input[1]].dims)
    if producer.op_type == "Conv":
        return dims[0] if len(dims) >= 3 else None
    if producer.op_type == "ConvTranspose":
        groups = int(attrs.get("group", 1))
        if len(dims) < 3 or dims[0] % groups:
            return None
        return dims[1] * groups
    if producer.op_type == "Gemm" and len(dims) == 2:
        return dims[0] if attrs.get("transB", 0) else dims[1]
    return None


def per_channel(constant: onnx.TensorProto, channels: int, rank: int | None) -> np.ndarray | None:
    """The constant as `channels` values when it broadcasts against a [N, C, ...] output of
    `rank` dims along C only (or is a single value); None otherwise."""
    dims = list(constant.dims)
    size = int(np.prod(dims, dtype=np.int64)) if dims else 1
    if rank is None or len(dims) > rank or rank < 2:
        return None
    aligned = [1] * (rank - len(dims)) + dims
    if aligned[1] not in (1, channels) or any(d != 1 for axis, d in enumerate(aligned) if axis != 1):
        return None
    values = tensor_array(constant).astype(np.float64).reshape(-1)
    return np.full(channels, values[0]) if size == 1 else values


def scale_and_shift(
    producer: onnx.NodeProto,
    scale: np.ndarray,
    shift: np.ndarray,
    initializers: dict[str, onnx.TensorProto],
    uses: Counter[str],
    names: NameAllocator,
    graph: onnx.GraphProto,
) -> str | None:
    """Make the producer compute `out * scale + shift` (per output channel, both 1-D of
    `output_channels(producer)` values) by rewriting its constant weight and bias:

        Conv(X, W, b) * s + t               -> Conv(X, W * s, b * s + t)       (s on W's axis 0)
        ConvTranspose(X, W, b) * s + t      -> ConvTranspose(X, W * s, b * s + t)  (axis 1, per group)
        Gemm(A, B, C) * s + t               -> Gemm(A, B * s, beta * C * s + t) <beta = 1>
        BatchNormalization(X, g, b, m, v) * s + t -> BatchNormalization(X, g * s, b * s + t, m, v)

    A missing bias is added as `<node>/bias` (unless `t` is all zeros). The caller checks
    that the weight and bias are floating-point initializers and renames the output.
    None when done, else why not (nothing is changed then)."""
    channels = scale.size
    attrs = {a.name: helper.get_attribute_value(a) for a in producer.attribute}
    if producer.op_type == "BatchNormalization":
        gamma, beta = (tensor_array(initializers[n]) for n in producer.input[1:3])
        new_gamma = gamma.astype(np.float64) * scale
        new_beta = beta.astype(np.float64) * scale + shift
        producer.input[1] = _store(new_gamma.astype(gamma.dtype), producer.input[1], uses, names, graph, initializers)
        producer.input[2] = _store(new_beta.astype(beta.dtype), producer.input[2], uses, names, graph, initializers)
        return None

    weight_tensor = initializers[producer.input[1]]
    weight = tensor_array(weight_tensor).astype(np.float64)
    has_bias = len(producer.input) > 2 and bool(producer.input[2])
    bias = tensor_array(initializers[producer.input[2]]).astype(np.float64) if has_bias else None

    if producer.op_type == "Conv":
        new_weight = weight * scale.reshape((-1,) + (1,) * (weight.ndim - 1))
    elif producer.op_type == "ConvTranspose":
        groups = int(attrs.get("group", 1))
        # W is [C_in, C_out/groups, k...]; output channel g*C_out/groups + j scales W[g-th block, j]
        grouped = weight.reshape((groups, weight.shape[0] // groups) + weight.shape[1:])
        per_group = scale.reshape((groups, 1, weight.shape[1]) + (1,) * (weight.ndim - 2))
        new_weight = (grouped * per_group).reshape(weight.shape)
    else:  # Gemm: Y = alpha * A' B' + beta * C, with the channels the N columns of Y
        axis = 0 if attrs.get("transB", 0) else 1
        new_weight = weight * (scale[:, None] if axis == 0 else scale[None, :])
        if bias is not None:
            bias = bias * float(attrs.get("beta", 1.0))
            try:
                np.broadcast_shapes(bias.shape, (1, channels))
            except ValueError:
                return f"the bias of {label(producer)} does not broadcast to {channels} columns"

    if producer.op_type != "Gemm" and bias is not None and bias.shape != (channels,):
        return f"the bias of {label(producer)} does not have {channels} values"
    add_bias = bias is not None or bool(np.any(shift))
    new_bias = (bias if bias is not None else np.zeros(channels)) * scale + shift

    dtype = tensor_array(weight_tensor).dtype
    producer.input[1] = _store(new_weight.astype(dtype), producer.input[1], uses, names, graph, initializers)
    if has_bias:
        producer.input[2] = _store(new_bias.astype(dtype), producer.input[2], uses, names, graph, initializers)
    elif add_bias:
        name = names.fresh(f"{producer.name or producer.output[0]}/bias")
        initializers[name] = add_initializer(graph, new_bias.astype(dtype), name)
        uses[name] += 1
        if len(producer.input) < 3:
            producer.input.append(name)
        else:
            producer.input[2] = name
    if producer.op_type == "Gemm" and (has_bias or add_bias):
        _set_attribute(producer, "beta", 1.0)
    return None


def _store(
    value: np.ndarray,
    name: str,
    uses: Counter[str],
    names: NameAllocator,
    graph: onnx.GraphProto,
    initializers: dict[str, onnx.TensorProto],
) -> str:
    """Write `value` over initializer `name` if only this producer reads it, else to a new
    initializer `<name>/folded`; return the name the producer should read."""
    if uses[name] <= 1:
        set_tensor(initializers[name], value, name)
        return name
    new = names.fresh(f"{name}/folded")
    initializers[new] = add_initializer(graph, value, new)
    uses[name] -= 1
    uses[new] += 1
    return new


def _set_attribute(node: onnx.NodeProto, name: str, value) -> None:
    keep = [a for a in node.attribute if a.name != name]
    del node.attribute[:]
    node.attribute.extend(keep)
    node.attribute.append(helper.make_attribute(name, value))
