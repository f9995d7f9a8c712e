"""One inference pass over a data folder that feeds one `TensorObserver` per activation.

The model is run with the activations to observe added as extra graph outputs (only those:
not every intermediate), one batch at a time; each batch's arrays update the observers and
are dropped, so memory stays flat in the number of samples. Which tensors is the caller's
choice: `calibrate` passes the plan's (`Plan.calibrated_tensors`), so exactly what the
quantization needs is observed. Tensors inside If/Loop bodies cannot be graph outputs; the
quantizer leaves those subgraphs float unless they are inlined first.

The pass is a pipeline (reading, inference, observing in three threads); a tensor that only
rearranges another observed tensor's values (Reshape, Transpose...) takes that tensor's
statistics instead of being binned again; small outputs are pooled per tensor before they reach
the observer. None of this changes a statistic: the histograms do not depend on how values are
grouped or ordered (observers.py), and the values binned of each sample are fixed by the sample
alone (sampling.py; default `SAMPLE_VALUES`, None: every value); count, min, max stay exact.
`benchmarks/calibration.py` measures the pass.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import onnx

from qcli.calibrate.channels import ChannelObserver
from qcli.calibrate.grid import DEFAULT_MAX_BINS
from qcli.calibrate.observers import TensorObserver
from qcli.calibrate.sampling import SAMPLE_VALUES
from qcli.data import Batch, DataFolder
from qcli.errors import DataError
from qcli.graph import GraphIndex, computing
from qcli.rules import rearranges
from qcli.runtime import make_session


def session_with_outputs(model: onnx.ModelProto, names: list[str], threads: int | None = None):
    """An onnxruntime session of `model` whose graph also outputs `names` (types left to
    onnxruntime). The outputs are added to `model` itself while the session is built, then
    removed: a copy of the model would hold its weights twice, which for a large model dominates
    the pass's peak memory. Not for a model other threads read meanwhile."""
    existing = {o.name for o in model.graph.output}
    kept = len(model.graph.output)
    model.graph.output.extend(onnx.ValueInfoProto(name=n) for n in dict.fromkeys(names) if n not in existing)
    try:
        return make_session(model, threads=threads, pass_only=True, frugal=True)
    finally:
        del model.graph.output[kept:]


def rows_of(model: onnx.ModelProto, names: list[str], folders: Sequence[DataFolder], batch_size: int,
            progress: Callable[[int], None] | None = None) -> Iterator[tuple[str, np.ndarray]]:
    """(name, its values as rows [-1, last axis] float32) of each of `names` for every batch of
    `folders`, in order (`values_by_folder`)."""
    for _, name, x in values_by_folder(model, names, folders, batch_size, progress):
        yield name, x.reshape(-1, x.shape[-1])


def values_by_folder(model: onnx.ModelProto, names: list[str], folders: Sequence[DataFolder], batch_size: int,
                     progress: Callable[[int], None] | None = None) -> Iterator[tuple[int, str, np.ndarray]]:
    """(which folder, name, its values float32) of each of `names` for every batch of `folders`,
    in order: one pass of a session of the part of the graph that computes them
    (`qcli.graph.computing`: onnxruntime runs every node whatever a run fetches, and holds every
    graph output; a decoder's logits were 131 MB a batch), big weights unpacked (`pass_only`)."""
    session = make_session(computing(model, names), pass_only=True, frugal=True)
    wanted = {i.name for i in session.get_inputs()}
    for k, folder in enumerate(folders):
        for batch in folder.batches(batch_size):
            feeds = {key: v for key, v in batch.inputs.items() if key in wanted}
            for name, value in zip(names, session.run(names, feeds), strict=True):
                yield k, name, np.asarray(value, np.float32)
            if progress is not None:
                progress(batch.size)


def observing_session(model: onnx.ModelProto, tensors: list[str], channels: dict[str, int] | None = None,
                      threads: int | None = None):
    """The session `collect` runs: `model` also outputting `tensors` and `channels`' tensors."""
    return session_with_outputs(model, [*dict.fromkeys(tensors), *(channels or {})], threads)


#: Batches a pipeline stage may run ahead of the next (memory: this many batches per stage).
_AHEAD = 1

#: Bytes of observed tensors one onnxruntime run may return. A batch whose observed tensors
#: would take more is run in smaller parts (statistics do not depend on batching), sized from
#: the largest per-sample figure seen so far (the first batch's first sample is run alone to
#: measure it); at most three runs' outputs are alive in the pipeline (one being computed, one
#: queued, one observed), and when a single sample's outputs exceed this, each run is observed
#: before the next starts, so one is (docs/guides/calibration.md, "Memory").
RUN_OUTPUT_BYTES = 160 << 20
#: The bytes a run aims at (`RunSize`): runs of 8 photos returned up to 3 x 160 MB at once
#: for no speed (PP-LCNet's pass 695-738 -> 405-409 MB, 1.28-1.46 -> 1.23-1.30 s). A sample
#: above it runs alone, observed beside the next run up to RUN_OUTPUT_BYTES: observed before
#: the next starts, the PP-OCRv4 detector's 124 MB samples took 2.5 -> 3.0 s.
RUN_TARGET_BYTES = 64 << 20


def value_aliases(model: onnx.ModelProto, names: list[str]) -> dict[str, str]:
    """Tensors of `names` that hold exactly the values of another tensor of `names`
    (through Reshape, Transpose, Flatten... chains), mapped to that tensor.

    Their statistics are copied from it rather than computed again (`adopt_values`): in a
    Transformer, the q/k/v projections' Reshape and Transpose outputs would otherwise triple
    the histogram work for those tensors.
    """
    index = GraphIndex.of(model)
    wanted = set(names)

    def source_of(name: str) -> str | None:
        """The furthest tensor of `names` up a chain of rearranging ops ending at `name`."""
        found, seen = None, {name}
        node = index.producer_node(name)
        while node is not None and rearranges(node):
            source = node.input[0] if node.input else ""
            if not source or source in seen:
                break
            seen.add(source)
            if source in wanted:
                found = source
            node = index.producer_node(source)
        return found

    aliases = {}
    for name in names:
        source = source_of(name)
        if source is not None:
            aliases[name] = source
    return aliases


@dataclass
class Collected:
    """What one pass produced: an observer per float tensor, and what was left out."""

    observers: dict[str, TensorObserver]
    samples: int
    batches: int
    skipped: list[str] = field(default_factory=list)  # requested tensors that were not float
    # tensor -> the observed tensor whose values it holds (Reshape, Transpose...): their
    # statistics are equal, so anything solved from them (ranges) is equal too.
    aliases: dict[str, str] = field(default_factory=dict)
    # tensor -> its per-channel statistics, for the tensors asked for them (`channels`)
    channels: dict[str, ChannelObserver] = field(default_factory=dict)


def collect(
    model: onnx.ModelProto,
    folder: DataFolder,
    *,
    tensors: list[str],
    batch_size: int = 8,
    max_bins: int = DEFAULT_MAX_BINS,
    progress: Callable[[int], None] | None = None,
    background: bool = True,
    threads: int | None = None,
    sample_values: int | None = SAMPLE_VALUES,
    first_sample: int = 0,
    reference: onnx.ModelProto | None = None,
    channels: dict[str, int] | None = None,
    session: Any = None,
) -> Collected:
    """Run `model` over `folder` once and observe `tensors` (names given twice count once).

    With `background` (the default) the pass is a three-stage pipeline: a thread reads and
    batches the next samples, the calling thread runs onnxruntime, and another thread updates
    the observers with the previous batch's outputs. onnxruntime and numpy release the GIL, so
    the observers' work overlaps inference (onnxruntime rarely keeps every core busy on small
    batches). Each stage holds at most one batch ahead of the next, so memory stays flat in
    the number of samples; the statistics are the same as without threads (each observer sees
    the batches in order, and its histogram does not depend on order anyway).

    Tensors named twice are observed once. Requested tensors that turn out not to be float
    are left out (`Collected.skipped`). `threads`: onnxruntime intra-op threads (default: one
    per core; a worker sharing the machine with others takes its share). `sample_values`:
    at least this many values of each sample are binned (None: all; sampling.py);
    `first_sample`: the index of the folder's first sample in the whole stream (a shard's).
    `reference`: the model as the user gave it (before preparation): when a run fails, it is
    run on the same inputs to tell the user's model failing from qcli's changes failing.
    `channels`: tensor -> axis, tensors whose per-channel statistics are kept too (SmoothQuant's),
    in the same pass. `session`: `observing_session(model, tensors, channels, threads)` when the
    caller runs several folders through one (k-fold calibration's folds).
    """
    names = list(dict.fromkeys(tensors))
    if not names and not channels:  # nothing to observe (weight-only): the samples are read, not run
        return _counted(folder, batch_size, progress)
    session = session or observing_session(model, tensors, channels, threads)
    observers = {name: TensorObserver(max_bins=max_bins, name=name, sample_values=sample_values) for name in names}
    sink = _ObserverSink(names, observers, value_aliases(model, names), background, first_sample)
    sink.add_channels(channels or {})
    samples = batches = 0
    stream = folder.batches(batch_size)
    if background:
        stream = prefetch(stream, depth=_AHEAD)
    run_size = RunSize(RUN_OUTPUT_BYTES, RUN_TARGET_BYTES)

    try:
        for batch in stream:
            for part in parts(batch, run_size):
                values = _run(session, sink.names, part, batch, folder, reference)
                run_size.note(values, part.size)
                sink.put(values, part.size, wait=run_size.waits)
                del values  # the sink holds them while they are observed, and no longer
                samples += part.size
                batches += 1
                if progress is not None:
                    progress(part.size)
    except BaseException:
        sink.close(reraise=False)
        raise
    finally:
        close = getattr(stream, "close", None)
        if close is not None:
            close()  # stops the reading thread, if any
    sink.close()
    aliases = {}
    for name, source in sink.aliases.items():
        if name in observers and source in observers:
            observers[name].adopt_values(observers[source])
            aliases[name] = source
    return Collected(observers, samples, batches, sink.skipped, aliases, sink.channels)


def _counted(folder: DataFolder, batch_size: int, progress: Callable[[int], None] | None) -> Collected:
    """What a pass observing nothing collects: the samples and batches, each read and checked
    against the model's inputs (a weight-only config's calibration: its 26 s of inference on a
    368M-parameter decoder bought nothing)."""
    samples = batches = 0
    for batch in folder.batches(batch_size):
        samples, batches = samples + batch.size, batches + 1
        if progress is not None:
            progress(batch.size)
    return Collected({}, samples, batches, [], {}, {})


def _run(session, names: list[str], part: Batch, batch: Batch, folder: DataFolder,
         reference: onnx.ModelProto | None) -> list:
    """The outputs `names` of one run on `part` (of `batch`); DataError naming the batch's files
    when onnxruntime fails."""
    try:
        return session.run(names, part.inputs)
    except Exception as exc:  # onnxruntime's Fail / InvalidArgument / RuntimeException
        first, last = batch.sources[0], batch.sources[-1]
        where = first if len(batch.sources) == 1 else f"{first} .. {last}"
        raise DataError(
            f"onnxruntime failed on {folder.path / where}: {str(exc).strip()}",
            hint=_failure_hint(reference, part.inputs),
        ) from exc


def _failure_hint(reference: onnx.ModelProto | None, inputs: dict[str, np.ndarray]) -> str:
    """What to do about a failed run: whether the model as given fails on these inputs too."""
    if reference is None:
        return "check that this sample is a valid input for the model"
    try:
        make_session(reference).run(None, inputs)
    except Exception:  # noqa: BLE001 - any failure means the same: the model itself fails
        return ("the model fails on this sample as given, before any change by qcli: an exporter may "
                "have fixed a dimension inside the graph (a Reshape to the export-time shape); run the "
                "model on a sample of this size with onnxruntime, re-export it with dynamic axes, or give "
                "samples of the size it was exported with")
    return ("the model as given runs on this sample, so qcli's preparation broke it: this is a bug in "
            "qcli; rerun with --debug and report it")


class RunSize:
    """How many samples one run may take for its outputs to stay within `target` bytes (None:
    `limit`; at most `limit`): one until a run has been measured (`note`), then as many as the
    most bytes a sample has produced so far allows (at least one). Called before each slice by
    `parts`; `waits`: a sample's outputs exceed `limit`, so each run is observed before the
    next starts.

    >>> size = RunSize(limit=160, target=64)
    >>> size.per_sample = 20; size(), size.waits
    (3, False)
    >>> size.per_sample = 124; size(), size.waits
    (1, False)
    >>> size.per_sample = 200; size(), size.waits
    (1, True)
    """

    def __init__(self, limit: int, target: int | None = None):
        self.limit, self.per_sample = limit, 0
        self.target = limit if target is None else min(target, limit)

    def __call__(self) -> int:
        return 1 if self.per_sample == 0 else max(1, self.target // self.per_sample)

    @property
    def waits(self) -> bool:
        return self.per_sample > self.limit

    def note(self, values: list, samples: int) -> None:
        nbytes = sum(v.nbytes for v in values if isinstance(v, np.ndarray))
        self.per_sample = max(self.per_sample, -(-nbytes // samples), 1)


def parts(batch: Batch, size: Callable[[], int]) -> Iterator[Batch]:
    """`batch`, or consecutive slices of it of `size()` samples (asked before each slice);
    a `whole` batch (no batch axis to split along) in one piece."""
    start = 0
    while start < batch.size:
        n = size()
        if start == 0 and (batch.whole or n >= batch.size):
            yield batch
            return
        stop = min(start + n, batch.size)
        yield Batch({k: v[start:stop] for k, v in batch.inputs.items()}, None, None, batch.sources)
        start = stop


class _ObserverSink:
    """Feeds each batch's outputs to the observers, inline or in one background thread.

    The queue holds one batch: `put` blocks while the thread is a batch behind, so at most
    three batches of outputs are alive (being observed, queued, being computed). Small
    outputs (variable-length data batches poorly: a Transformer's outputs are often a few
    thousand values) are pooled per tensor up to `POOL` values before they reach the
    observer, which then pays numpy's per-call overhead once per pool instead of once per
    batch; each batch's layout and sample count are still noted one by one.
    """

    POOL = 1 << 16  # values; at most this many per tensor wait in a pool (flat in samples)

    def __init__(
        self,
        names: list[str],
        observers: dict[str, TensorObserver],
        aliases: dict[str, str],
        background: bool,
        first_sample: int = 0,
    ):
        self.names = names
        self.next_sample = first_sample  # index in the whole stream of the next batch's first sample
        self.observers = observers
        self.aliases = aliases  # tensor -> the tensor whose values it holds: layout noted only
        self.skipped: list[str] = []
        self._pools: dict[str, list[tuple[np.ndarray, int, int]]] = {}
        self._pooled: dict[str, int] = {}
        self._error: BaseException | None = None
        self._abandoned = False
        self._queue: queue.Queue = queue.Queue(maxsize=_AHEAD)
        self._thread: threading.Thread | None = None
        self.channels: dict[str, ChannelObserver] = {}
        if background:
            self._thread = threading.Thread(target=self._loop, name="qcli-observe", daemon=True)
            self._thread.start()

    def add_channels(self, channels: dict[str, int]) -> None:
        """Keep per-channel statistics of these tensors (tensor -> axis) too; before any `put`."""
        self.channels = {name: ChannelObserver(axis) for name, axis in channels.items()}
        self.names = [*self.names, *(n for n in channels if n not in self.names)]

    def put(self, values: list, samples: int, wait: bool = False) -> None:
        """Hand a run's outputs over; `wait`: return once they have been observed."""
        if self._thread is None:
            self._update(values, samples)
            return
        if self._error is not None:
            raise self._error
        self._queue.put((values, samples))
        if wait:
            self._queue.join()

    def close(self, reraise: bool = True) -> None:
        """Wait for the observers to take every batch; raise what the thread raised.

        `reraise=False` is for a pass that is being abandoned: no error of the observers is
        raised (the caller has its own), and the pooled values are dropped.
        """
        self._abandoned = not reraise
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
        elif reraise and self._error is None:
            self._flush()
        if reraise and self._error is not None:
            raise self._error

    def _loop(self) -> None:
        while (item := self._queue.get()) is not None:
            if self._error is None:  # after an error, drain the queue so that `put` never blocks
                try:
                    self._update(*item)
                except BaseException as exc:  # re-raised in the calling thread
                    self._error = exc
            del item  # the outputs are freed before waiting for the next ones
            self._queue.task_done()
        if self._error is None and not self._abandoned:
            try:
                self._flush()
            except BaseException as exc:
                self._error = exc

    def _update(self, values: list, samples: int) -> None:
        first, self.next_sample = self.next_sample, self.next_sample + samples
        # strict=False: a run for no names returns every model output (onnxruntime's None).
        for name, value in zip(self.names, values, strict=False):
            per_channel = self.channels.get(name)
            if per_channel is not None and isinstance(value, np.ndarray) and value.dtype.kind == "f":
                per_channel.update(value, samples)
            observer = self.observers.get(name)
            if observer is None:
                continue
            if not isinstance(value, np.ndarray) or value.dtype.kind != "f":
                del self.observers[name]
                self._pools.pop(name, None)
                self.skipped.append(name)
                continue
            observer.update_layout(value, samples=samples)
            if name in self.aliases or value.size == 0:
                continue
            if value.size >= self.POOL:
                observer.update_values(value, samples, first)
                continue
            pool = self._pools.setdefault(name, [])
            pool.append((value, samples, first))
            self._pooled[name] = self._pooled.get(name, 0) + value.size
            if self._pooled[name] >= self.POOL:
                self._drain(name)

    def _drain(self, name: str) -> None:
        pool = self._pools.pop(name, [])
        self._pooled[name] = 0
        if pool:
            self.observers[name].update_batches(pool)

    def _flush(self) -> None:
        for name in list(self._pools):
            self._drain(name)


T = TypeVar("T")
_DONE = object()


def prefetch(items: Iterator[T], depth: int = 1) -> Generator[T, None, None]:
    """Yield `items`, produced by a background thread up to `depth` items ahead.

    An exception raised while producing is raised here, at the item it replaced. Closing the
    generator (or leaving a loop over it early) stops the thread.
    """
    slots: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in items:
                if not _offer(slots, (item, None), stop):
                    return
        except BaseException as exc:  # handed to the consumer
            _offer(slots, (_DONE, exc), stop)
            return
        _offer(slots, (_DONE, None), stop)

    thread = threading.Thread(target=produce, name="qcli-read", daemon=True)
    thread.start()
    try:
        while True:
            item, error = slots.get()
            if error is not None:
                raise error
            if item is _DONE:
                return
            yield item
    finally:
        stop.set()
        thread.join()


def _offer(slots: queue.Queue, entry: tuple, stop: threading.Event) -> bool:
    """Put `entry` once there is room; False if the consumer stopped first."""
    while not stop.is_set():
        try:
            slots.put(entry, timeout=0.05)
            return True
        except queue.Full:
            continue
    return False
