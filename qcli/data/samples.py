"""Samples as read from one file, and batches stacked from consecutive samples.

Every array carries a leading batch axis; a sample may hold a batch (a file of N samples), and
`take`/`split`/`stack` cut and join along that axis only.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from qcli.errors import InternalError

LABEL_KEY = "label"  # the array of a .npz that holds labels rather than an input


@dataclass
class Sample:
    """What one data file holds: arrays per input (leading batch axis), labels, reference outputs."""

    source: str  # path relative to the data folder, for messages
    inputs: dict[str, np.ndarray]
    label: np.ndarray | None = None  # int64 [batch]
    outputs: dict[str, np.ndarray] | None = None  # reference outputs (ONNX test data)
    # An input with a fixed first dimension (a [2, 4, 6] input) has no batch axis: the file is
    # one sample, never cut (a holdout or `samples: N` counts it as one).
    whole: bool = False

    @property
    def size(self) -> int:
        if self.whole:
            return 1
        return next(iter(self.inputs.values())).shape[0] if self.inputs else 0


@dataclass
class Batch:
    """Consecutive samples stacked along the batch axis, with the files they came from."""

    inputs: dict[str, np.ndarray]
    label: np.ndarray | None
    outputs: dict[str, np.ndarray] | None
    sources: list[str] = field(default_factory=list)
    # A model input with a fixed first dimension has no batch axis to split along: one run
    # takes the whole sample (a [2, 8] input split in two would not fit the model).
    whole: bool = False

    @property
    def size(self) -> int:
        """The samples it holds: one when `whole`, whatever its first input's first dimension.

        >>> state, x = np.zeros((2, 1, 4), np.float32), np.zeros((1, 3), np.float32)
        >>> Batch({"state": state, "x": x}, None, None, whole=True).size, Batch({"x": x}, None, None).size
        (1, 1)
        """
        if self.whole:
            return 1
        return next(iter(self.inputs.values())).shape[0]

    def sample(self, arrays: dict[str, np.ndarray], i: int) -> dict[str, np.ndarray]:
        """Sample `i` of `arrays` (this batch's inputs, or outputs computed from them): a
        batch-1 slice where the first axis is the batch, the arrays as they are otherwise.

        >>> x = np.arange(6.0).reshape(3, 2)
        >>> Batch({"x": x}, None, None).sample({"x": x, "s": np.float32(1)}, 1)["x"].tolist()
        [[2.0, 3.0]]
        """
        return {n: a[i:i + 1] if self.size > 1 and a.ndim and a.shape[0] == self.size else a
                for n, a in arrays.items()}


def signature(sample: Sample) -> tuple:
    """The shapes past the batch axis: samples stack only when these agree."""
    return tuple((k, v.shape[1:]) for k, v in sorted(sample.inputs.items()))


def take(sample: Sample, start: int, stop: int | None = None) -> Sample:
    """Samples [start:stop] of a batch (or [0:start] when only one bound is given).

    >>> s = Sample("a.npz", {"x": np.arange(5)[:, None]}, label=np.arange(5))
    >>> take(s, 1, 3).label.tolist(), take(s, 2).size
    ([1, 2], 2)
    """
    if stop is None:
        start, stop = 0, start
    if sample.whole:  # indivisible: callers cut at sample boundaries
        if start != 0 or stop < 1:
            raise InternalError(f"cutting samples [{start}:{stop}] out of {sample.source}, one indivisible sample")
        return sample
    cut = slice(start, stop)
    return Sample(
        sample.source,
        {k: v[cut] for k, v in sample.inputs.items()},
        None if sample.label is None else sample.label[cut],
        None if sample.outputs is None else {k: v[cut] for k, v in sample.outputs.items()},
    )


def split(sample: Sample, size: int) -> Iterator[Sample]:
    """The sample cut into parts of at most `size` along the batch axis."""
    if sample.size <= size:
        yield sample
        return
    for start in range(0, sample.size, size):
        yield take(sample, start, min(start + size, sample.size))


def stack(samples: list[Sample]) -> Batch:
    """Concatenate samples; labels/outputs only when every sample has them.

    >>> parts = [Sample(f"{i}.npy", {"x": np.full((1, 2), i)}, label=np.array([i])) for i in range(3)]
    >>> batch = stack(parts)
    >>> batch.size, batch.label.tolist(), batch.sources
    (3, [0, 1, 2], ['0.npy', '1.npy', '2.npy'])
    """
    sources = [s.source for s in samples]
    if len(samples) == 1:
        s = samples[0]
        return Batch(s.inputs, s.label, s.outputs, sources)
    inputs = {k: np.concatenate([s.inputs[k] for s in samples]) for k in samples[0].inputs}
    labels = [s.label for s in samples if s.label is not None]
    label = np.concatenate(labels) if len(labels) == len(samples) else None
    outs = [s.outputs for s in samples if s.outputs is not None]
    outputs = None
    if len(outs) == len(samples):
        try:
            outputs = {k: np.concatenate([o[k] for o in outs]) for k in outs[0]}
        except (KeyError, ValueError):
            outputs = None
    return Batch(inputs, label, outputs, sources)
