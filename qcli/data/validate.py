"""Check a sample against the model's inputs: names, rank, fixed dimensions, dtype, finite values,
labels. Errors name the file and the input; nothing is cast or reshaped silently (a single sample
only gets its batch axis)."""

from __future__ import annotations

import difflib
from pathlib import Path

import numpy as np

from qcli.data.inputs import InputSpec
from qcli.data.samples import LABEL_KEY, Sample
from qcli.errors import DataError


def validate(sample: Sample, inputs: list[InputSpec], root: Path) -> Sample:
    """The sample with a batch axis on every input and int64 labels, or a DataError naming
    `root / sample.source`."""
    where = root / sample.source
    expected = {s.name for s in inputs}
    for key in sample.inputs:
        if key not in expected:
            close = difflib.get_close_matches(key, sorted(expected), n=1)
            raise DataError(
                f"{where}: array {key!r} is not a model input "
                f"(inputs: {', '.join(sorted(expected))})",
                hint=f"did you mean {close[0]!r}?" if close else
                f"name each array after a model input; '{LABEL_KEY}' holds labels",
            )
    batch = None
    for spec in inputs:
        if spec.name not in sample.inputs:
            raise DataError(
                f"{where}: missing input {spec.name!r} (model inputs: "
                f"{', '.join(s.name for s in inputs)})",
                hint="each sample file needs one array per model input, keyed by its name",
            )
        array = _checked_array(sample.inputs[spec.name], spec, where)
        if batch is not None and spec.batchable and array.shape[0] != batch:
            raise DataError(f"{where}: inputs disagree on the batch size ({array.shape[0]} vs {batch})")
        if spec.batchable:
            batch = array.shape[0]
        sample.inputs[spec.name] = array
    if sample.label is not None:
        sample.label = _checked_label(sample.label, sample.size, where)
    sample.whole = not all(spec.batchable for spec in inputs)
    return sample


def _checked_array(array: np.ndarray, spec: InputSpec, where: Path) -> np.ndarray:
    array = with_batch_axis(array, spec, where)
    if array.dtype != spec.dtype:
        raise DataError(
            f"{where}: input {spec.name!r} is {array.dtype}, the model expects {spec.dtype}",
            hint=f"convert the data, e.g. array.astype(numpy.{spec.dtype})",
        )
    if np.issubdtype(array.dtype, np.floating) and not np.isfinite(array).all():
        bad = int(array.size - np.isfinite(array).sum())
        raise DataError(
            f"{where}: input {spec.name!r} contains {bad} NaN or Inf value(s)",
            hint="fix or drop this sample; calibration needs finite values",
        )
    return array


def with_batch_axis(array: np.ndarray, spec: InputSpec, where: Path) -> np.ndarray:
    """Give a single sample its batch axis; check rank and fixed dimensions.

    >>> spec = InputSpec("x", np.dtype("float32"), ("N", 3))
    >>> with_batch_axis(np.zeros(3, np.float32), spec, Path("a.npy")).shape
    (1, 3)
    >>> with_batch_axis(np.zeros((2, 4), np.float32), spec, Path("a.npy"))
    Traceback (most recent call last):
    qcli.errors.DataError: a.npy: input 'x' has shape [2, 4], the model expects [N, 3] (axis 1 must be 3)
    """
    rank = len(spec.shape)
    if array.ndim == rank - 1 and spec.batchable:
        array = array[None]
    if array.ndim != rank:
        raise DataError(
            f"{where}: input {spec.name!r} has shape {list(array.shape)}, the model expects "
            f"{spec.shape_text()} (rank {rank})",
            hint="store one sample without the batch axis, or a batch with it",
        )
    for axis, dim in enumerate(spec.shape):
        if isinstance(dim, int) and array.shape[axis] != dim:
            raise DataError(
                f"{where}: input {spec.name!r} has shape {list(array.shape)}, the model expects "
                f"{spec.shape_text()} (axis {axis} must be {dim})",
                hint="resize or reshape the data to the model's input shape",
            )
    return array


def _checked_label(label: np.ndarray, size: int, where: Path) -> np.ndarray:
    label = np.asarray(label)
    if not np.issubdtype(label.dtype, np.integer):
        raise DataError(f"{where}: '{LABEL_KEY}' must hold integers, got {label.dtype}")
    label = label.reshape(-1).astype(np.int64)
    if label.shape[0] != size:
        raise DataError(f"{where}: {label.shape[0]} label(s) for a batch of {size} sample(s)")
    return label

