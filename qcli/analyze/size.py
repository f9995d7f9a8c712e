"""Model size on disk and weight bytes by element type (reads headers only, not weight data)."""

from __future__ import annotations

from pathlib import Path

import onnx

from qcli.analyze.report import DtypeBytes, ModelSize, Size, rounded
from qcli.info import file_bytes, weight_census
from qcli.model import external_data_files, serialized_size


def model_size(path: Path, stored: onnx.ModelProto) -> ModelSize:
    """Size of the model at `path`; `stored` is that file loaded without its external data."""
    return ModelSize(file_bytes(path, stored), external_data_files(stored), *weight_bytes(stored))


def proto_size(model: onnx.ModelProto) -> ModelSize:
    """Size of an in-memory model as it would be written (one file, no external data)."""
    return ModelSize(serialized_size(model), [], *weight_bytes(model))


def weight_bytes(model: onnx.ModelProto) -> tuple[int, dict[str, DtypeBytes]]:
    """Total bytes and (count, bytes) per dtype of the stored tensors (`info.weight_census`)."""
    census = weight_census(model)
    weights = {k: DtypeBytes(v["parameters"], v["bytes"]) for k, v in census["by_dtype"].items()}
    return census["bytes"], weights


def compare_sizes(float_size: ModelSize, quantized_size: ModelSize) -> Size:
    ratio = float_size.file_bytes / max(quantized_size.file_bytes, 1)
    return Size(float_size, quantized_size, rounded(ratio, 4))
