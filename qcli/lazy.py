"""Weights left in the model's external-data file until read: a model past memory's comfort
(a decoder of 1.5 GB, 2.3 GB) held once, by onnxruntime, not again by qcli.

`load_model` leaves the external tensors of a model stored with external data where they are
(`defer`): each keeps its reference, its location made absolute (checked first as onnx checks
a location: relative, inside the model's folder, within the file). Then
- `tensor_array` / `tensor_raw` read one tensor's values when a pass needs them (numpy's
  `to_array` for the rest): qcli holds one weight at a time, not the model;
- a session's model names them relative to their folder again and tells onnxruntime the
  folder (`relative`): onnxruntime reads them as it reads the user's file;
- a written model gets them copied into its own `.data` file (`qcli.model.save_model`), or
  inline below protobuf's limit: a model qcli writes never points into another's files;
- a model sent to another process (qcli.executor's workers) keeps the references: they are
  absolute paths, readable from any process on the machine.
A model qcli builds mixes such references with inline tensors it made (quantized weights): the
float weights it keeps stay references, so copying a model copies no weight.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from qcli.errors import ModelError

_EXTERNAL = onnx.TensorProto.EXTERNAL


def all_tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """Every tensor of the model: initializers and Constant values of every graph and function."""
    yield from onnx.external_data_helper._get_all_tensors(model)


def _info(tensor: onnx.TensorProto) -> dict[str, str]:
    return {e.key: e.value for e in tensor.external_data}


def deferred(tensor: onnx.TensorProto) -> bool:
    """Whether `tensor`'s values are in a file qcli has not read (`defer`)."""
    return tensor.data_location == _EXTERNAL and os.path.isabs(_info(tensor).get("location", ""))


def defer(model: onnx.ModelProto, folder: Path, shown_as: Path) -> None:
    """Make each external tensor of `model` (read from `folder`) a deferred one; a ModelError
    naming `shown_as` and the tensor when its location leaves the folder or its bytes the file."""
    root = folder.resolve()
    sizes: dict[Path, int] = {}
    for tensor in all_tensors(model):
        if tensor.data_location != _EXTERNAL:
            continue
        info = _info(tensor)
        location = info.get("location", "")
        where = (root / location).resolve()
        if not location or os.path.isabs(location) or root not in where.parents:
            raise ModelError(f"cannot read the external data of {shown_as}: tensor {tensor.name!r} points "
                             f"outside the model's folder ({location!r})",
                             hint="keep the model's .data file(s) in the same folder as the .onnx file")
        if where not in sizes:
            try:
                sizes[where] = where.stat().st_size
            except OSError as exc:
                raise ModelError(f"cannot read the external data of {shown_as}: {location}: {exc.strerror}",
                                 hint="keep the model's .data file(s) in the same folder as the .onnx file") from exc
        offset = int(info.get("offset", 0))
        length = int(info.get("length", sizes[where] - offset))
        if offset < 0 or length < 0 or offset + length > sizes[where]:
            raise ModelError(f"cannot read the external data of {shown_as}: tensor {tensor.name!r} lies past the "
                             f"end of {location} ({offset} + {length} > {sizes[where]} bytes)",
                             hint="the .data file is truncated or belongs to another export: export again")
        _set(tensor, str(where), offset, length)


def _set(tensor: onnx.TensorProto, location: str, offset: int, length: int) -> None:
    del tensor.external_data[:]
    tensor.data_location = _EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        tensor.external_data.add(key=key, value=value)


def tensor_raw(tensor: onnx.TensorProto) -> bytes:
    """A deferred tensor's bytes as the file holds them (raw_data's layout)."""
    info = _info(tensor)
    with open(info["location"], "rb") as file:
        file.seek(int(info["offset"]))
        return file.read(int(info["length"]))


_PLAIN = {onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.INT64, onnx.TensorProto.INT32,
          onnx.TensorProto.INT16, onnx.TensorProto.INT8, onnx.TensorProto.UINT8, onnx.TensorProto.UINT16,
          onnx.TensorProto.UINT32, onnx.TensorProto.UINT64, onnx.TensorProto.FLOAT16, onnx.TensorProto.BOOL}


def tensor_array(tensor: onnx.TensorProto) -> np.ndarray:
    """`tensor`'s values (numpy's `to_array`, reading a deferred tensor from its file)."""
    if not deferred(tensor):
        return numpy_helper.to_array(tensor)
    if tensor.data_type in _PLAIN:  # read into the array itself: no copy of the bytes
        info = _info(tensor)
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type)).newbyteorder("<")
        count = int(info["length"]) // dtype.itemsize
        return np.fromfile(info["location"], dtype, count, offset=int(info["offset"])).reshape(tuple(tensor.dims))
    raw = tensor_raw(tensor)
    inline = onnx.TensorProto(name=tensor.name, dims=tensor.dims, data_type=tensor.data_type, raw_data=raw)
    return numpy_helper.to_array(inline)  # packed 4-bit, bfloat16, float8: onnx's own unpacking


def inline(tensor: onnx.TensorProto) -> None:
    """Read a deferred tensor's bytes into it (nothing for others)."""
    if deferred(tensor):
        raw = tensor_raw(tensor)
        del tensor.external_data[:]
        tensor.ClearField("data_location")  # as onnx's loader leaves it: the same bytes written
        tensor.raw_data = raw


def referenced(model: onnx.ModelProto) -> set[str]:
    """The files the model's deferred tensors lie in."""
    return {_info(t)["location"] for t in all_tensors(model) if deferred(t)}


def deferred_bytes(model: onnx.ModelProto) -> int:
    """The bytes of the model's deferred tensors (what `save_model` copies out of their files)."""
    return sum(int(_info(t)["length"]) for t in all_tensors(model) if deferred(t))


@contextmanager
def relative(model: onnx.ModelProto) -> Iterator[str | None]:
    """Within the block, `model`'s deferred tensors named relative to their folder, as
    onnxruntime reads them, and that folder (for
    `session.model_external_initializers_file_folder_path`); None without any. A model whose
    deferred tensors lie in several folders (never one qcli builds) has the other folders' read
    inline for good. Absolute again after the block."""
    folder, moved = None, []
    for tensor in all_tensors(model):
        if not deferred(tensor):
            continue
        info = _info(tensor)
        path = Path(info["location"])
        folder = folder or str(path.parent)
        if str(path.parent) != folder:
            inline(tensor)
            continue
        _set(tensor, path.name, int(info["offset"]), int(info["length"]))
        moved.append((tensor, info))
    try:
        yield folder
    finally:
        for tensor, info in moved:
            _set(tensor, info["location"], int(info["offset"]), int(info["length"]))
