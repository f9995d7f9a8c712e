"""Model size on disk and weight bytes by element type (reads headers only, not weight data)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from qcli.analyze.report import DtypeBytes, ModelSize, Size, rounded
from qcli.info import iter_graphs
from qcli.model import external_data_files, tensor_from_attribute

# Element types stored several to a byte: bits per element.
_SUB_BYTE = {
    getattr(onnx.TensorProto, name): bits
    for name, bits in (("INT4", 4), ("UINT4", 4), ("FLOAT4E2M1", 4), ("INT2", 2), ("UINT2", 2))
    if hasattr(onnx.TensorProto, name)
}


def _dtype_name(data_type: int) -> str:
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(data_type)).name
    except (KeyError, TypeError, ValueError):
        return onnx.TensorProto.DataType.Name(data_type).lower()


def _nbytes(data_type: int, count: int) -> int:
    if data_type in _SUB_BYTE:
        return (count * _SUB_BYTE[data_type] + 7) // 8
    if data_type == onnx.TensorProto.STRING:
        return 0
    try:
        return count * np.dtype(onnx.helper.tensor_dtype_to_np_dtype(data_type)).itemsize
    except (KeyError, TypeError, ValueError):
        return 0


def model_size(path: Path, stored: onnx.ModelProto) -> ModelSize:
    """Size of the model at `path`; `stored` is that file loaded without its external data."""
    external = external_data_files(stored)
    file_bytes = path.stat().st_size + sum((path.parent / f).stat().st_size for f in external)
    return ModelSize(file_bytes, external, *weight_bytes(stored))


def proto_size(model: onnx.ModelProto) -> ModelSize:
    """Size of an in-memory model as it would be written (one file, no external data)."""
    return ModelSize(model.ByteSize(), [], *weight_bytes(model))


def weight_bytes(model: onnx.ModelProto) -> tuple[int, dict[str, DtypeBytes]]:
    """Total bytes and (count, bytes) per dtype of initializers and Constant-node tensors, in
    every graph (subgraphs too); sub-byte types (int4, ...) count packed."""
    by_dtype: dict[str, list[int]] = {}
    for _, graph in iter_graphs(model.graph):
        tensors = list(graph.initializer)
        for node in graph.node:
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
                tensor = tensor_from_attribute(node)
                if tensor is not None:
                    tensors.append(tensor)
        for t in tensors:
            count = int(np.prod(t.dims, dtype=np.int64)) if len(t.dims) else 1
            entry = by_dtype.setdefault(_dtype_name(t.data_type), [0, 0])
            entry[0] += count
            entry[1] += _nbytes(t.data_type, count)
    weights = {k: DtypeBytes(v[0], v[1]) for k, v in sorted(by_dtype.items())}
    return sum(w.bytes for w in weights.values()), weights


def compare_sizes(float_size: ModelSize, quantized_size: ModelSize) -> Size:
    ratio = float_size.file_bytes / max(quantized_size.file_bytes, 1)
    return Size(float_size, quantized_size, rounded(ratio, 4))
