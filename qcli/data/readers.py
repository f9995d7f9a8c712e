"""One reader per entry kind (`.npz`, `.npy`, ONNX test data set, image, text), looked up in `READERS`.

A reader turns an entry into a `Sample` (arrays not yet checked against the model) and counts
the samples an entry holds from array headers where the format has them, without reading data.
"""

from __future__ import annotations

import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np
import onnx
from onnx import numpy_helper

from qcli.data.inputs import InputSpec
from qcli.data.preprocess import Preprocess
from qcli.data.samples import LABEL_KEY, Sample
from qcli.data.scan import Entry, EntryKind
from qcli.data.text import DEFAULT_SEQ_LEN, read_text_file
from qcli.errors import DataError


@dataclass(frozen=True)
class Reading:
    """How a folder's files become inputs: images' preprocessing, text's chunk length in tokens."""

    preprocess: Preprocess | None = None
    seq_len: int = DEFAULT_SEQ_LEN


@dataclass(frozen=True)
class Reader:
    """How one kind of entry is read."""

    read: Callable[[Entry, list[InputSpec], Reading], Sample]
    # Samples in the entry as its headers tell for the model's first input; None: read it to know.
    count: Callable[[Entry, InputSpec], int | None]


def _read_npz(entry: Entry, inputs: list[InputSpec], reading: Reading) -> Sample:
    try:
        with np.load(entry.path, allow_pickle=False) as npz:
            arrays = {key: npz[key] for key in npz.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise DataError(f"cannot read {entry.path}: {exc}", hint="the file is corrupt or not a .npz archive") from exc
    label = arrays.pop(LABEL_KEY, None)
    return Sample(entry.rel, arrays, label)


def _read_npy(entry: Entry, inputs: list[InputSpec], reading: Reading) -> Sample:
    if len(inputs) != 1:
        raise DataError(
            f"{entry.path}: .npy files feed single-input models, but the model has "
            f"{len(inputs)} inputs ({', '.join(s.name for s in inputs)})",
            hint="store each sample as .npz with one array per input name",
        )
    try:
        array = np.load(entry.path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise DataError(f"cannot read {entry.path}: {exc}", hint="the file is corrupt or not a .npy array") from exc
    return Sample(entry.rel, {inputs[0].name: array})


def _read_test_data_set(entry: Entry, inputs: list[InputSpec], reading: Reading) -> Sample:
    """`input_<i>.pb` in input order (a tensor named after no model input takes the i-th input's
    name); `output_<i>.pb` kept as reference outputs."""
    tensors = _tensor_files(entry.path, "input")
    if len(tensors) != len(inputs):
        raise DataError(
            f"{entry.rel}: {len(tensors)} input_<i>.pb files for a model with "
            f"{len(inputs)} inputs ({', '.join(s.name for s in inputs)})"
        )
    names = {s.name for s in inputs}
    arrays = {name if name in names else spec.name: array for (name, array), spec in zip(tensors, inputs, strict=True)}
    outputs = dict(_tensor_files(entry.path, "output")) or None
    return Sample(entry.rel, arrays, outputs=outputs)


def _tensor_files(folder: Path, prefix: str) -> list[tuple[str, np.ndarray]]:
    """The tensors of `folder/<prefix>_<i>.pb`, by increasing i, as (name, array)."""

    def index(p: Path) -> int:
        tail = p.stem.split("_")[-1]
        return int(tail) if tail.isdigit() else 1 << 30

    out = []
    for p in sorted(folder.glob(f"{prefix}_*.pb"), key=index):
        proto = onnx.TensorProto()
        try:
            proto.ParseFromString(p.read_bytes())
            out.append((proto.name, numpy_helper.to_array(proto)))
        except Exception as exc:  # DecodeError, or a tensor numpy cannot represent
            raise DataError(f"cannot read tensor file {p}: {exc}") from exc
    return out


def _read_image(entry: Entry, inputs: list[InputSpec], reading: Reading) -> Sample:
    if reading.preprocess is None:
        raise DataError(
            f"{entry.root} holds images but no preprocessing is configured",
            hint="add a data.preprocess section (resize, scale, mean, std, channels, "
            "layout) to the YAML given with --config",
        )
    if len(inputs) != 1:
        raise DataError(f"images feed single-input models; the model has {len(inputs)} inputs")
    image = reading.preprocess.apply(entry.path)
    label = None if entry.class_label is None else np.array([entry.class_label], np.int64)
    return Sample(entry.rel, {inputs[0].name: image}, label)


# --------------------------------------------------------------------------- counting from headers


def _from_header(shape: tuple[int, ...] | None, spec: InputSpec) -> int:
    """An array with the input's rank is a batch (when the input batches); anything else one sample."""
    if shape is None:
        return 1
    return shape[0] if len(shape) == len(spec.shape) and spec.batchable else 1


def _count_npz(entry: Entry, spec: InputSpec) -> int:
    try:
        with zipfile.ZipFile(entry.path) as zf, zf.open(spec.name + ".npy") as fh:
            return _from_header(_npy_header_shape(fh), spec)
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return 1


def _count_npy(entry: Entry, spec: InputSpec) -> int:
    try:
        with open(entry.path, "rb") as fh:
            return _from_header(_npy_header_shape(fh), spec)
    except (OSError, ValueError):
        return 1


def _count_test_data_set(entry: Entry, spec: InputSpec) -> int | None:
    return None if spec.batchable else 1  # a .pb tensor has no header to read apart from its data


def _npy_header_shape(fh: IO[bytes]) -> tuple[int, ...]:
    version = np.lib.format.read_magic(fh)
    reader = {
        (1, 0): np.lib.format.read_array_header_1_0,
        (2, 0): np.lib.format.read_array_header_2_0,
    }.get(version)
    if reader is None:
        raise ValueError(f"unsupported .npy version {version}")
    shape, _, _ = reader(fh)
    return tuple(shape)


READERS: dict[EntryKind, Reader] = {
    "npz": Reader(_read_npz, _count_npz),
    "npy": Reader(_read_npy, _count_npy),
    "pb": Reader(_read_test_data_set, _count_test_data_set),
    "image": Reader(_read_image, lambda entry, spec: 1),
    "text": Reader(lambda entry, inputs, reading: read_text_file(entry.path, entry.rel, inputs, reading.seq_len),
                   lambda entry, spec: None),
}
