"""Calibration split into shards: contiguous runs of a data folder's files, each observed by
one worker (`collect_shard`) and merged in shard order (`merge`) into what one pass over the
whole folder gives. The observers' merge is exact (observers.py), so counts, min, max and
histograms, hence every range and the quantized model, are identical to one process's.

Shards start where a single pass starts a new batch (`plan_shards`), so the workers run the
same batches as one process, and even the recorded batch shapes agree. That is worked out
from the files' sizes (array headers), assuming consecutive samples share their shape; where
they do not, only the recorded batch shape can differ, never a statistic.

A worker gets the model as bytes and the folder restricted to its files (paths, not arrays):
it reads its samples itself, on its machine. It is also told the index of its shard's first
sample in the whole folder: which values of a sample the histograms bin depends on that index
(the first samples are binned whole, see sampling.py), so the merge stays exact.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import onnx

from qcli.calibrate.collect import Collected, collect, observing_session
from qcli.data import DataFolder
from qcli.errors import CalibrationError, WorkerLost
from qcli.executor import Executor, SerialExecutor
from qcli.model import PROTOBUF_LIMIT, serialized_size


@dataclass(frozen=True)
class Shard:
    """Files `start..stop-1` of a data folder, holding samples `first..first+samples-1`."""

    start: int
    stop: int
    first: int
    samples: int


def plan_shards(folder: DataFolder, count: int, batch_size: int) -> list[Shard]:
    """Split the samples `folder` streams into at most `count` contiguous shards of about
    equal size, each starting where one pass over the folder starts a new batch."""
    sizes = folder.entry_sizes()
    fresh = _batch_starts(sizes, batch_size, all(spec.batchable for spec in folder.inputs))
    before = [0]
    for size in sizes:
        before.append(before[-1] + size)
    total = before[-1]
    cuts = [0]
    for k in range(1, count):
        target = total * k / count
        candidates = [i for i in range(cuts[-1] + 1, len(sizes)) if fresh[i]]
        if not candidates:
            break
        cuts.append(min(candidates, key=lambda i: abs(before[i] - target)))
    cuts.append(len(sizes))
    return [Shard(a, b, before[a], before[b] - before[a]) for a, b in pairwise(cuts)]


def _batch_starts(sizes: list[int], batch_size: int, stackable: bool) -> list[bool]:
    """For each file, whether `DataFolder.batches` starts a new batch at it (nothing pending
    from earlier files). Mirrors its rule: a file larger than a batch is split into parts of
    `batch_size`; a part that does not fit the pending batch starts the next one."""
    fresh, count = [], 0
    for size in sizes:
        if not stackable:
            fresh.append(True)
            continue
        parts = [size] if size <= batch_size else [min(batch_size, size - s) for s in range(0, size, batch_size)]
        fresh.append(count == 0 or count + parts[0] > batch_size)
        for part in parts:
            if count and count + part > batch_size:
                count = 0
            count += part
    return fresh


@dataclass(frozen=True)
class ShardTask:
    """What one worker needs: plain, picklable values."""

    model: bytes
    folder: DataFolder
    tensors: list[str]
    batch_size: int
    max_bins: int
    threads: int | None
    first_sample: int = 0  # index of the shard's first sample in the whole stream
    channels: dict[str, int] | None = None  # tensors whose per-channel statistics are kept (axis)


def collect_shard(task: ShardTask) -> Collected:
    """One worker's pass over its shard (runs in the worker process)."""
    model = onnx.ModelProto.FromString(task.model)
    return collect(
        model, task.folder, tensors=task.tensors, batch_size=task.batch_size, max_bins=task.max_bins,
        threads=task.threads, first_sample=task.first_sample, channels=task.channels,
    )


def merge(parts: list[Collected]) -> Collected:
    """The shards' statistics merged in order: what one pass over all of them gives."""
    merged = parts[0]
    for part in parts[1:]:
        for name, observer in merged.observers.items():
            observer.merge(part.observers[name])
        for name, per_channel in merged.channels.items():
            per_channel.merge(part.channels[name])
        merged.samples += part.samples
        merged.batches += part.batches
    for name, source in merged.aliases.items():  # a Reshape's output: its source's values
        merged.observers[name].adopt_values(merged.observers[source])
    return merged


def collect_sharded(model: onnx.ModelProto, folder: DataFolder, executor: Executor, *, batch_size: int,
                    **options: Any) -> Collected:
    """`collect` over `folder` in one shard per worker of `executor`, merged; `options`: the
    rest of `_collect_tasks`'s (tensors, max_bins, progress, channels)."""
    shards = plan_shards(folder, executor.workers, batch_size)
    parts = [(folder.subset(s.start, s.stop, s.samples), s.first) for s in shards]
    return merge(_collect_tasks(model, parts, executor, batch_size=batch_size, **options))


def _collect_tasks(
    model: onnx.ModelProto,
    parts: list[tuple[DataFolder, int]],
    executor: Executor,
    *,
    tensors: list[str],
    batch_size: int,
    max_bins: int,
    progress: Callable[[int], None] | None = None,
    channels: dict[str, int] | None = None,
) -> list[Collected]:
    """Each part's statistics (a folder and the index of its first sample in the whole stream),
    one task per part on `executor`'s workers, in order."""
    if serialized_size(model) >= PROTOBUF_LIMIT:
        raise CalibrationError(
            "models of 2 GB or more calibrate in one process",
            hint="use --workers 1",
        )
    blob = model.SerializeToString()
    tasks = [ShardTask(blob, part, tensors, batch_size, max_bins, executor.threads, first, channels)
             for part, first in parts]

    def done(index: int, part: Collected) -> None:
        if progress is not None:
            progress(part.samples)

    try:
        return executor.map(collect_shard, tasks, done=done)
    except WorkerLost as exc:
        part, first = parts[exc.index]
        raise CalibrationError(
            f"a calibration worker died twice on shard {exc.index + 1} of {len(parts)}: samples "
            f"{first}..{first + len(part) - 1}, from {part.first_file()}",
            hint=exc.hint,
        ) from None


@dataclass(frozen=True)
class Fold:
    """Samples `first..first+samples-1` of the calibration stream (k-fold verification)."""

    first: int
    samples: int


def plan_folds(samples: int, count: int, batch_size: int) -> list[Fold]:
    """`samples` split into `count` contiguous folds of about equal size (fewer when there are
    fewer samples), cut where one pass starts a batch when that keeps every fold non-empty.

    >>> plan_folds(32, 4, 8)
    [Fold(first=0, samples=8), Fold(first=8, samples=8), Fold(first=16, samples=8), Fold(first=24, samples=8)]
    >>> [f.samples for f in plan_folds(10, 4, 8)]
    [2, 3, 3, 2]
    """
    count = min(count, samples)
    cuts = [round(samples * k / count / batch_size) * batch_size for k in range(count + 1)]
    cuts[-1] = samples
    if len(set(cuts)) < len(cuts) or sorted(cuts) != cuts:
        cuts = [round(samples * k / count) for k in range(count + 1)]
    return [Fold(a, b - a) for a, b in pairwise(cuts)]


def collect_folds(
    model: onnx.ModelProto,
    folder: DataFolder,
    folds: list[Fold],
    executor: Executor | None,
    *,
    tensors: list[str],
    batch_size: int,
    max_bins: int,
    progress: Callable[[int], None] | None = None,
    channels: dict[str, int] | None = None,
    reference: onnx.ModelProto | None = None,
) -> list[Collected]:
    """One pass over `folder` keeping each fold's statistics apart (k-fold verification):
    merging all of them gives one pass's statistics exactly (observers.py; each fold is told the
    index of its first sample, as a shard is). In this process the folds share one session;
    with a parallel executor each fold is a worker's task."""
    parts = [(folder.window(f.first, f.samples), f.first) for f in folds]
    if executor is not None and not isinstance(executor, SerialExecutor):
        return _collect_tasks(model, parts, executor, tensors=tensors, batch_size=batch_size, max_bins=max_bins,
                              progress=progress, channels=channels)
    session = observing_session(model, tensors, channels)
    return [collect(model, part, tensors=tensors, batch_size=batch_size, max_bins=max_bins, progress=progress,
                    first_sample=first, reference=reference, channels=channels, session=session)
            for part, first in parts]


def merged_except(parts: list[Collected], left_out: int | None = None) -> Collected:
    """`parts` but `left_out` merged (None: all of them) into a copy of the first; `parts` are
    not changed (`merge` changes only the first, and reads the others)."""
    kept = [p for k, p in enumerate(parts) if k != left_out]
    return merge([copy.deepcopy(kept[0]), *kept[1:]])
