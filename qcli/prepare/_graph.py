"""What the prepare passes share: `PassResult`, `Options`, and small graph helpers (who uses a
tensor, how a node is named in a note, fresh deterministic names, a weight-less model copy)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import onnx
from onnx import helper, numpy_helper

from qcli.graph import iter_graphs, names_used_inside
from qcli.model import without_initializers

DEFAULT_DOMAINS = ("", "ai.onnx")
TARGET_OPSET = 13  # per-channel QuantizeLinear/DequantizeLinear
BLOCK_OPSET = 21  # DequantizeLinear's block_size: per-block weights


@dataclass
class PassResult:
    """What a pass returns: the model (edited in place, or a new object), whether anything
    changed, and one human sentence per change."""

    model: onnx.ModelProto
    modified: bool = False
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Options:
    """Switches a pass may read. `force`: quantize an already quantized model anyway;
    `opset`: the least default-domain opset the prepared model has (TARGET_OPSET, or
    BLOCK_OPSET for per-block weights)."""

    force: bool = False
    opset: int = TARGET_OPSET


def is_default_domain(node: onnx.NodeProto) -> bool:
    return node.domain in DEFAULT_DOMAINS


def label(node: onnx.NodeProto) -> str:
    """How notes and errors name a node: `Conv '/conv1'`, or by its first output if unnamed."""
    if node.name:
        return f"{node.op_type} '{node.name}'"
    if node.output and node.output[0]:
        return f"{node.op_type} (output '{node.output[0]}')"
    return node.op_type


def plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def use_counts(graph: onnx.GraphProto) -> Counter[str]:
    """How many times each tensor is read: as a node input, from inside a node's subgraph
    (once per node), or as a graph output."""
    uses: Counter[str] = Counter()
    for node in graph.node:
        uses.update(name for name in node.input if name)
        uses.update(names_used_inside(node))
    uses.update(o.name for o in graph.output)
    return uses


def remove_nodes(graph: onnx.GraphProto, indices: Iterable[int]) -> None:
    for index in sorted(set(indices), reverse=True):
        del graph.node[index]


def remove_unused_initializers(graph: onnx.GraphProto) -> list[str]:
    """Drop initializers (and their graph-input and value_info entries) nothing reads."""
    uses = use_counts(graph)
    unused = [i for i, t in enumerate(graph.initializer) if not uses[t.name]]
    names = [graph.initializer[i].name for i in unused]
    for index in reversed(unused):
        del graph.initializer[index]
    _remove_by_name(graph.input, names)
    _remove_by_name(graph.value_info, names)
    return names


def prune_value_info(graph: onnx.GraphProto) -> None:
    """Forget value_info of tensors no node produces any more (shape inference refills)."""
    produced = {o for node in graph.node for o in node.output}
    stale = [v.name for v in graph.value_info if v.name not in produced]
    _remove_by_name(graph.value_info, stale)


def _remove_by_name(values, names: Iterable[str]) -> None:
    doomed = set(names)
    for index in reversed([i for i, v in enumerate(values) if v.name in doomed]):
        del values[index]


class NameAllocator:
    """Hands out names not yet used, derived from a base: `base`, then `base_1`, `base_2`..."""

    def __init__(self, taken: Iterable[str]):
        self.taken = set(taken)

    def fresh(self, base: str) -> str:
        name, suffix = base, 0
        while name in self.taken or not name:
            suffix += 1
            name = f"{base}_{suffix}"
        self.taken.add(name)
        return name


def tensor_names(graph: onnx.GraphProto, *, deep: bool = True) -> set[str]:
    """Every tensor name a graph (and, if `deep`, its subgraphs) defines or reads."""
    names: set[str] = set()
    graphs = [g for _, g in iter_graphs(graph)] if deep else [graph]
    for g in graphs:
        for node in g.node:
            names.update(node.input)
            names.update(node.output)
        names.update(t.name for t in g.initializer)
        names.update(t.values.name for t in g.sparse_initializer)
        names.update(v.name for v in (*g.input, *g.output, *g.value_info))
    names.discard("")
    return names


def node_names(graph: onnx.GraphProto) -> set[str]:
    return {node.name for _, g in iter_graphs(graph) for node in g.node if node.name}


def tensor_nbytes(tensor: onnx.TensorProto) -> int:
    count = int(np.prod(tensor.dims, dtype=np.int64)) if len(tensor.dims) else 1
    try:
        itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
    except (KeyError, TypeError, ValueError):  # undefined or exotic data types
        itemsize = 1
    return count * itemsize


def set_tensor(tensor: onnx.TensorProto, array: np.ndarray, name: str) -> onnx.TensorProto:
    """Store `array` in `tensor` (replacing its data) as `numpy_helper.from_array` would, but
    copying big plain arrays once instead of twice (weights can be hundreds of MB)."""
    array = np.asarray(array)
    try:
        data_type = helper.np_dtype_to_tensor_dtype(array.dtype)
    except (KeyError, TypeError, ValueError):
        data_type = None
    if data_type is None or array.dtype.kind not in "biuf":  # strings, custom types: onnx's way
        tensor.CopyFrom(numpy_helper.from_array(array, name))
        return tensor
    tensor.Clear()
    tensor.name = name
    tensor.data_type = data_type
    tensor.dims.extend(array.shape)
    tensor.raw_data = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
    return tensor


def add_initializer(graph: onnx.GraphProto, array: np.ndarray, name: str) -> onnx.TensorProto:
    return set_tensor(graph.initializer.add(), array, name)


# Main-graph initializers at least this big are left out of `light_copy`: no ONNX C++ tool
# (version converter, shape inference) needs their values, only their type and shape. Shape
# tensors, axes and scales that shape inference reads are far smaller.
LIGHT_THRESHOLD = 64 * 1024


class LightCopy(NamedTuple):
    model: onnx.ModelProto
    left_out: list[str]  # names of the big initializers whose data was left out
    added_inputs: list[str]  # those of them declared as graph inputs in the copy only


def light_copy(model: onnx.ModelProto, threshold: int = LIGHT_THRESHOLD) -> LightCopy:
    """A copy of `model` without the data of its big main-graph initializers: each is declared
    as a graph input of the same name, type and shape instead (unless it already is one).

    The C++ tools serialise the whole model (and refuse above 2 GB); handing them this copy
    keeps them fast and memory-flat whatever the weight size, and never copies the weights.
    """
    light = without_initializers(model)
    declared = {v.name for v in model.graph.input}
    left_out, added = [], []
    for tensor in model.graph.initializer:
        if tensor_nbytes(tensor) < threshold:
            light.graph.initializer.append(tensor)
            continue
        left_out.append(tensor.name)
        if tensor.name not in declared:
            light.graph.input.append(
                helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims))
            )
            added.append(tensor.name)
    return LightCopy(light, left_out, added)


def transplant(converted: onnx.ModelProto, model: onnx.ModelProto, light: LightCopy) -> None:
    """Move a graph a C++ tool made from `light` (the version converter, the inliner) into
    `model`, whose big initializers never left it: only the small ones are replaced by the
    tool's (in the model's order; the tool's new ones after), and the inputs `light` declared
    for the big ones are dropped again."""
    big = set(light.left_out)
    initializers = model.graph.initializer
    position = {t.name: i for i, t in enumerate(initializers)}
    for index in reversed(range(len(initializers))):
        if initializers[index].name not in big:
            del initializers[index]
    initializers.extend(converted.graph.initializer)
    initializers.sort(key=lambda t: position.get(t.name, len(position)))  # in place: no weight copied
    added = set(light.added_inputs)
    for part in ("node", "input", "output", "value_info", "sparse_initializer"):
        target = getattr(model.graph, part)
        del target[:]
        target.extend(v for v in getattr(converted.graph, part) if getattr(v, "name", None) not in added)
    del model.opset_import[:]
    model.opset_import.extend(converted.opset_import)
    del model.functions[:]
    model.functions.extend(converted.functions)
