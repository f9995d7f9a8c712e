"""A data folder read as a stream of validated samples, and batched.

The folder is scanned once (`scan`); each entry is read by the reader of its kind (`READERS`),
given its labels.csv label, and checked against the model's inputs (`validate`). Only one entry
is in memory at a time, plus the batch being assembled.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from qcli.data.inputs import InputSpec
from qcli.data.readers import READERS, Reading
from qcli.data.samples import Batch, Sample, signature, split, stack, take
from qcli.data.scan import Entry, read_labels, scan
from qcli.data.validate import validate
from qcli.errors import DataError, ModelError


class DataFolder:
    """A data folder read as a stream of validated samples; see the package docstring.

    >>> import numpy as np
    >>> root = getfixture("tmp_path")
    >>> for i in range(5):
    ...     np.save(root / f"{i}.npy", np.full((1, 3), i, np.float32))
    >>> folder = DataFolder(root, [InputSpec("x", np.dtype("float32"), ("N", 3))], samples=4)
    >>> len(folder), folder.layout
    (4, 'npy')
    >>> [(batch.sources, batch.inputs["x"].shape) for batch in folder.batches(3)]
    [(['0.npy', '1.npy', '2.npy'], (3, 3)), (['3.npy'], (1, 3))]
    """

    def __init__(
        self,
        path: str | os.PathLike,
        inputs: list[InputSpec],
        *,
        reading: Reading | None = None,
        samples: int | None = None,
        labels: str | os.PathLike | None = None,
        start: int = 0,
    ):
        """`labels`: a labels.csv kept outside the folder (default: DIR/labels.csv if present);
        `reading`: images' preprocessing and text's chunk length (default: none, 128 tokens);
        `start`: skip the first `start` samples (`samples` counts from there). A model with no
        inputs is refused (ModelError): it has no samples, every run computes the same outputs."""
        if not inputs:
            raise ModelError(
                "the model has no inputs: every run computes the same outputs, so there is no data to feed "
                "it and nothing to calibrate or compare",
                hint="qcli quantizes models that take inputs; export the model with its inputs as graph inputs "
                "(not folded in as constants)",
            )
        self.path = Path(path)
        self.labels_file = Path(labels) if labels is not None else None
        self.inputs = inputs
        self.reading = reading or Reading()
        self.limit = samples
        self.start = start
        if start < 0:
            raise DataError(f"the first sample must be at least 0, got {start}")
        if samples is not None and samples < 1:
            raise DataError(f"the number of samples must be at least 1, got {samples}")
        if not self.path.exists():
            raise DataError(f"data folder not found: {self.path}")
        if not self.path.is_dir():
            raise DataError(f"{self.path} is not a folder", hint="--data takes a folder of samples")
        found = scan(self.path)
        self.entries: list[Entry] = found.entries
        self.layout = found.layout
        self.class_names = found.class_names
        self.labels_csv = read_labels(self.path, self.entries, self.labels_file)

    def __len__(self) -> int:
        """Number of samples the stream yields (reads only array headers, not data)."""
        total = 0
        for entry in self.entries:
            total += self._entry_size(entry)
            if self.limit is not None and total >= self.start + self.limit:
                return self.limit
        return max(total - self.start, 0)

    def _entry_size(self, entry: Entry) -> int:
        if not all(spec.batchable for spec in self.inputs):
            return 1  # a whole sample (Sample.whole)
        count = READERS[entry.kind].count(entry, self.inputs[0])
        return self.read(entry).size if count is None else count

    def entry_sizes(self) -> list[int]:
        """Samples each file gives, in order, for the files the stream reads (the last one
        cut to `samples=N`); from array headers, as `len`. For folders read from their first
        sample (`start=0`: calibration data, which is what is sharded)."""
        sizes: list[int] = []
        total = 0
        for entry in self.entries:
            if self.limit is not None and total >= self.limit:
                break
            size = self._entry_size(entry)
            if self.limit is not None:
                size = min(size, self.limit - total)
            sizes.append(size)
            total += size
        return sizes

    def subset(self, start: int, stop: int, samples: int | None = None) -> DataFolder:
        """This folder restricted to its files `start..stop-1` (and their first `samples`
        samples): a shard that a worker reads on its own. Holds paths, not arrays."""
        part = copy.copy(self)
        part.entries = self.entries[start:stop]
        part.limit = samples
        names = {e.rel for e in part.entries}
        part.labels_csv = {k: v for k, v in self.labels_csv.items() if k in names}
        return part

    def window(self, first: int, samples: int) -> DataFolder:
        """This folder's samples `first..first+samples-1` (counted from its own first)."""
        part = copy.copy(self)
        part.start, part.limit = self.start + first, samples
        return part

    def first_file(self) -> Path:
        """The file holding this folder's first sample (for messages)."""
        skip = self.start
        for entry in self.entries:
            size = self._entry_size(entry) if skip else 1
            if size > skip:
                return self.path / entry.rel
            skip -= size
        return self.path

    def __iter__(self) -> Iterator[Sample]:
        """Validated samples in sorted file order, one file in memory at a time."""
        remaining, skip = self.limit, self.start
        for entry in self.entries:
            if skip and (size := self._entry_size(entry)) <= skip:
                skip -= size  # read only the headers of skipped files
                continue
            sample = self.read(entry)
            if skip:
                sample, skip = take(sample, skip, sample.size), 0
            if remaining is not None:
                if remaining <= 0:
                    return
                if sample.size > remaining:
                    sample = take(sample, remaining)
                remaining -= sample.size
            yield sample

    def read(self, entry: Entry) -> Sample:
        """Load one entry, give it its labels.csv label, and check it against the model inputs."""
        sample = READERS[entry.kind].read(entry, self.inputs, self.reading)
        if entry.rel in self.labels_csv:
            sample.label = self.labels_csv[entry.rel]
        return validate(sample, self.inputs, self.path)

    def batches(self, batch_size: int) -> Iterator[Batch]:
        """Stack consecutive samples whose shapes agree into batches of up to `batch_size`.

        A new batch starts whenever a sample's shapes (past the batch axis) differ from the
        pending ones, so variable-length data (e.g. token sequences) still batches where it can.
        """
        if batch_size < 1:
            raise DataError(f"the batch size must be at least 1, got {batch_size}")
        stackable = all(spec.batchable for spec in self.inputs)
        pending: list[Sample] = []
        count = 0
        for sample in self:
            if not stackable:
                yield replace(stack([sample]), whole=True)
                continue
            for part in split(sample, batch_size):
                if pending and (signature(pending[0]) != signature(part) or count + part.size > batch_size):
                    yield stack(pending)
                    pending, count = [], 0
                pending.append(part)
                count += part.size
        if pending:
            yield stack(pending)
