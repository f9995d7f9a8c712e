"""Batches of arrays spilled to a temporary folder: what a probe holds of float outputs too
large to keep in memory (a decoder's logits: qcli.analyze.probe), and of its samples' inputs
past INPUTS_HELD_BYTES (`HeldBatches`: the layout detector's 64 pages of 608 x 800 held 373 MB)."""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import overload

import numpy as np

from qcli.data import Batch

INPUTS_HELD_BYTES = 128 << 20  # a probe's samples' inputs held in memory, at most (`HeldBatches`)


class Spilled(Sequence[list[np.ndarray]]):
    """Batches of arrays kept in a temporary folder (TMPDIR), one `.npy` file an array, each
    batch read back when asked for: memory holds one batch, not all of them. The folder goes
    with the object."""

    def __init__(self) -> None:
        self._folder = tempfile.TemporaryDirectory(prefix="qcli-reference-")
        self._counts: list[int] = []

    def append(self, arrays: list[np.ndarray]) -> None:
        for i, array in enumerate(arrays):
            np.save(Path(self._folder.name) / f"{len(self._counts)}-{i}.npy", array, allow_pickle=False)
        self._counts.append(len(arrays))

    def __len__(self) -> int:
        return len(self._counts)

    @overload
    def __getitem__(self, j: int) -> list[np.ndarray]: ...
    @overload
    def __getitem__(self, j: slice) -> list[list[np.ndarray]]: ...
    def __getitem__(self, j: int | slice) -> list[np.ndarray] | list[list[np.ndarray]]:
        if isinstance(j, slice):
            return [self[i] for i in range(*j.indices(len(self)))]
        j = range(len(self))[j]
        return [np.load(Path(self._folder.name) / f"{j}-{i}.npy") for i in range(self._counts[j])]


class HeldBatches(Sequence[Batch]):
    """Batches whose inputs are held in memory while they add up to at most `held` bytes, in
    order; each later one's inputs are spilled (`Spilled`) and read back whenever it is asked
    for, so that memory holds `held` bytes and one batch, however many samples a probe compares
    on. Which batches are spilled depends on their sizes alone. `sizes`: each batch's samples,
    and `one_shape`: whether every batch's inputs have the same shapes, known without reading a
    spilled one back.

    >>> held = HeldBatches([Batch({"x": np.full((2, 4), k, np.float32)}, None, None) for k in range(3)], held=40)
    >>> held.sizes, [int(b.inputs["x"][0, 0]) for b in held], held.spilled, held.one_shape
    ([2, 2, 2], [0, 1, 2], 2, True)
    """

    def __init__(self, batches: Iterable[Batch] = (), held: int | None = None) -> None:
        self._held, self._bytes = INPUTS_HELD_BYTES if held is None else held, 0
        self._kept: list[Batch] = []  # a spilled batch without its inputs
        self._where: list[tuple[int, list[str]] | None] = []  # a spilled batch's place and input names
        self._spilled: Spilled | None = None
        self.sizes: list[int] = []
        self._shapes: set[tuple] = set()
        for batch in batches:
            self.append(batch)

    @property
    def one_shape(self) -> bool:
        return len(self._shapes) <= 1

    @property
    def spilled(self) -> int:
        return 0 if self._spilled is None else len(self._spilled)

    def append(self, batch: Batch) -> None:
        size = sum(a.nbytes for a in batch.inputs.values())
        self.sizes.append(batch.size)
        self._shapes.add(tuple((name, np.shape(a)) for name, a in batch.inputs.items()))
        if self._spilled is None and self._bytes + size <= self._held:
            self._bytes += size
            self._kept.append(batch)
            self._where.append(None)
            return
        self._spilled = self._spilled or Spilled()
        names = list(batch.inputs)
        self._where.append((len(self._spilled), names))
        self._spilled.append([batch.inputs[n] for n in names])
        self._kept.append(replace(batch, inputs={}))

    def __len__(self) -> int:
        return len(self._kept)

    @overload
    def __getitem__(self, j: int) -> Batch: ...
    @overload
    def __getitem__(self, j: slice) -> list[Batch]: ...
    def __getitem__(self, j: int | slice) -> Batch | list[Batch]:
        if isinstance(j, slice):
            return [self[i] for i in range(*j.indices(len(self)))]
        j = range(len(self))[j]
        where = self._where[j]
        if where is None:
            return self._kept[j]
        assert self._spilled is not None  # a batch has a place only once spilled
        return replace(self._kept[j], inputs=dict(zip(where[1], self._spilled[where[0]], strict=True)))
