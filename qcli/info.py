"""What `qcli inspect` reports about a model: opsets, inputs/outputs, op types, weights, subgraphs.

`describe_model` returns a plain JSON-ready dict (the `--json` document); the CLI renders it.
The helpers it is built on serve the rest of qcli too: walking subgraphs (`iter_graphs`,
`node_subgraphs`, `names_used_inside`), counting weights (`weight_census`) and measuring a
model file with its external data (`file_bytes`).
"""

from __future__ import annotations

import math
import os
from collections import Counter
from pathlib import Path

import numpy as np
import onnx

from qcli.graph import iter_graphs
from qcli.lazy import tensor_array
from qcli.model import external_data_files, fingerprint, load_model, tensor_from_attribute

INFO_FORMAT = "qcli-inspect/1"


def file_bytes(path: str | os.PathLike, stored: onnx.ModelProto | None = None) -> int:
    """A model's size on disk, its external data files included (`stored`: the model as
    loaded without external data, when the caller has it)."""
    path = Path(path)
    stored = stored if stored is not None else load_model(path, load_external_data=False)
    return path.stat().st_size + sum((path.parent / f).stat().st_size for f in external_data_files(stored))


# Element types stored several to a byte: bits per element.
_SUB_BYTE = {
    getattr(onnx.TensorProto, name): bits
    for name, bits in (("INT4", 4), ("UINT4", 4), ("FLOAT4E2M1", 4), ("INT2", 2), ("UINT2", 2))
    if hasattr(onnx.TensorProto, name)
}


def dtype_name(data_type: int) -> str:
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(data_type)).name
    except (KeyError, TypeError, ValueError):
        return onnx.TensorProto.DataType.Name(data_type).lower()


def tensor_bytes(data_type: int, count: int) -> int:
    """Bytes `count` elements take as stored (sub-byte types packed, strings not counted)."""
    if data_type in _SUB_BYTE:
        return (count * _SUB_BYTE[data_type] + 7) // 8
    if data_type == onnx.TensorProto.STRING:
        return 0
    try:
        return count * np.dtype(onnx.helper.tensor_dtype_to_np_dtype(data_type)).itemsize
    except (KeyError, TypeError, ValueError):
        return 0


def _type_text(tp: onnx.TypeProto) -> str:
    """A tensor's element type ("float32"), or a structured type as ONNX spells it, with the
    element type: "seq(map(int64, float32))" (skl2onnx's ZipMap), "optional(float32)"."""
    kind = tp.WhichOneof("value")
    if kind == "tensor_type":
        elem = tp.tensor_type.elem_type
        return onnx.helper.tensor_dtype_to_np_dtype(elem).name if elem else "unknown"
    if kind == "sequence_type":
        return f"seq({_type_text(tp.sequence_type.elem_type)})"
    if kind == "map_type":
        key = onnx.helper.tensor_dtype_to_np_dtype(tp.map_type.key_type).name
        return f"map({key}, {_type_text(tp.map_type.value_type)})"
    if kind == "optional_type":
        return f"optional({_type_text(tp.optional_type.elem_type)})"
    return kind or "unknown"


def _value_info(value: onnx.ValueInfoProto) -> dict:
    t = value.type.tensor_type
    dims: list[int | str | None] = []  # a size, a symbolic name, or unknown
    for d in t.shape.dim:
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        else:
            dims.append(d.dim_param or None)
    shape = dims if value.type.WhichOneof("value") == "tensor_type" else None  # a sequence has none
    return {"name": value.name, "dtype": _type_text(value.type), "shape": shape}


def weight_census(model: onnx.ModelProto) -> dict:
    """Element count and bytes per dtype of every stored tensor, in every graph: initializers,
    Constant nodes, and ConstantOfShape fills of a constant shape (a weight written as "fill
    this shape", as the model zoo's light models do: it is a real tensor at run time)."""
    by_dtype: Counter[str] = Counter()
    elements: Counter[str] = Counter()
    initializers = constants = filled = 0
    for _, graph in iter_graphs(model.graph):
        tensors = [(t.data_type, element_count(t.dims)) for t in graph.initializer]  # (type, count)
        initializers += len(graph.initializer)
        known = {t.name: t for t in graph.initializer}
        for node in graph.node:
            if node.domain not in ("", "ai.onnx"):
                continue
            if node.op_type == "Constant":
                tensor = tensor_from_attribute(node)
                if tensor is not None:
                    known[node.output[0]] = tensor
                    tensors.append((tensor.data_type, element_count(tensor.dims)))
                    constants += 1
            elif node.op_type == "ConstantOfShape" and node.input and node.input[0] in known:
                shape = tensor_array(known[node.input[0]])
                value = tensor_from_attribute(node)
                data_type = value.data_type if value is not None else onnx.TensorProto.FLOAT
                tensors.append((data_type, int(np.prod(shape, dtype=np.int64))))
                filled += 1
        for data_type, count in tensors:
            name = dtype_name(data_type)
            elements[name] += count
            by_dtype[name] += tensor_bytes(data_type, count)
    return {
        "parameters": int(sum(elements.values())),
        "bytes": int(sum(by_dtype.values())),
        "by_dtype": {
            k: {"parameters": int(elements[k]), "bytes": int(by_dtype[k])} for k in sorted(by_dtype)
        },
        "initializers": initializers,
        "constant_nodes": constants,
        "constant_of_shape_nodes": filled,
    }


def element_count(dims) -> int:
    """How many values a tensor of these dims holds (numpy's prod costs ~5 us a call: every
    session of a search's trials counts every initializer)."""
    return math.prod(dims)


def describe_model(path: str | os.PathLike) -> dict:
    """Everything `qcli inspect` shows, as a JSON-ready dict."""
    path = Path(path)
    stored = load_model(path, load_external_data=False)
    ext_files = external_data_files(stored)
    model = load_model(path) if ext_files else stored
    op_types: Counter[str] = Counter()
    subgraphs = []
    for owner, graph in iter_graphs(model.graph):
        op_types.update(
            n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}" for n in graph.node
        )
        if owner:
            subgraphs.append({"owner": owner, "nodes": len(graph.node)})
    external = [{"file": name, "bytes": (path.parent / name).stat().st_size} for name in ext_files]
    return {
        "format": INFO_FORMAT,
        "path": str(path),
        "file_bytes": file_bytes(path, stored),
        "ir_version": model.ir_version,
        "producer": " ".join(x for x in (model.producer_name, model.producer_version) if x),
        "opsets": {(o.domain or "ai.onnx"): o.version for o in model.opset_import},
        "fingerprint": fingerprint(model),
        "inputs": [
            _value_info(v) for v in model.graph.input
            if v.name not in {t.name for t in model.graph.initializer}
        ],
        "outputs": [_value_info(v) for v in model.graph.output],
        "nodes": sum(op_types.values()),
        "op_types": dict(sorted(op_types.items(), key=lambda kv: (-kv[1], kv[0]))),
        "weights": weight_census(model),
        "external_data": external,
        "subgraphs": subgraphs,
    }


def describe_data(folder) -> dict:
    """Read a whole `DataFolder` (validating every sample) and summarise what it holds."""
    samples = files = 0
    shapes: Counter[str] = Counter()
    labels: Counter[int] = Counter()
    unlabelled = 0
    for sample in folder:
        files += 1
        samples += sample.size
        shapes[", ".join(f"{k}{list(v.shape[1:])}" for k, v in sample.inputs.items())] += sample.size
        if sample.label is None:
            unlabelled += sample.size
        else:
            labels.update(int(x) for x in sample.label)
    return {
        "path": str(folder.path),
        "layout": folder.layout,
        "files": files,
        "samples": samples,
        "shapes": dict(shapes.most_common()),
        "labelled": samples - unlabelled,
        "classes": {str(k): v for k, v in sorted(labels.items())},
        "class_names": folder.class_names,
    }
