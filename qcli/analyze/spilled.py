"""Batches of arrays spilled to a temporary folder: what a probe holds of float outputs too
large to keep in memory (a decoder's logits: qcli.analyze.probe)."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import overload

import numpy as np


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
