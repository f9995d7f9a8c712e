"""Quick, repeated comparisons of candidate models with the float model, for verification and
automatic mixed precision (which try many candidates on the same few samples).

A `Probe` holds a small set of batches (the held-back samples: tens to a few hundred; their
inputs past INPUTS_HELD_BYTES in a temporary folder, `HeldBatches`) and the float model's
outputs on them, computed once. `measure(candidate)` runs a candidate on
the same batches and returns a `Fidelity` summary:

- per output, the metric of its kind (qcli.analyze.kinds, decided once from the graph and the
  float outputs, `verify.outputs` first): top-1 or sequence agreement, a thresholded mask's IoU,
  element agreement, mean cosine, SQNR; `ignore` outputs are reported, never gated;
- with labels: top-1 accuracy of both models;
- with `verify.metric`: the user's score and its floor (qcli.analyze.plugin);
- `noise`: the outputs' quantization noise power over their signal power, summed over the
  gated float outputs. It is continuous where agreement moves in whole samples, which is what
  makes it the sensitivity measure of `qcli.precision` (a ranking needs small differences to show).

`latency_ratio(candidate)` is the target profile's predicted ratio to the float model (the
user's file, at the deployment's batch: qcli.target), or with `verify.latency: measured` the
candidate timed against it exactly as `analyze` does (alternating runs, spinning off);
`node_runs(models)` gives each node's predicted time, or reads onnxruntime's profiler on
several models taking turns: each node's kernel time in each run, by node name (fused int8
nodes keep the original node's name).
"""

from __future__ import annotations

import bisect
import itertools
import json
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, overload

import numpy as np
import onnx

from qcli.analyze.confidence import z_of
from qcli.analyze.fidelity import Fidelity, output_fidelity
from qcli.analyze.kinds import Kind, OutputKind, cache_outputs, output_kinds
from qcli.analyze.latency import Ratio, measure, paired, timed_inputs
from qcli.analyze.margins import MarginPool
from qcli.analyze.metrics import MARGIN_KINDS, FidelityAccumulator, TopKAccumulator, as_array
from qcli.analyze.plugin import load_metric
from qcli.analyze.predicted import served
from qcli.analyze.size import weight_bytes
from qcli.analyze.spilled import HeldBatches, Spilled
from qcli.config import Verify
from qcli.data import Batch, InputSpec
from qcli.errors import DataError
from qcli.executor import cores
from qcli.phases import phase
from qcli.runtime import make_session
from qcli.simulation import Simulated
from qcli.target.predict import Prediction

PROFILE_RUNS = (5, 20)  # profiled runs per node-time profile: at least, at most
PROFILE_MS = 100.0  # float run time the profiled runs take at most, above the least runs
TIMING_ROUNDS = (12, 40)  # rounds of one latency timing: at least, at most
TIMING_MS = 300.0  # float run time one timing's rounds take at most, above the least rounds
# float weights up to which a probe keeps the float session (`_float_session`): past it, that
# session (runtime.UNPACKED_BYTES) leaves them unpacked, slower to time
HELD_SESSION_BYTES = 256 << 20
REFERENCE_HELD_BYTES = 256 << 20  # float outputs a probe holds in memory, at most (`Spilled`)
# The agreement each kind is gated on, by name (a check's name; cosine is gated apart).
_POOLS: dict[int, ThreadPoolExecutor] = {}  # by process id: a forked worker's copy has no threads


def _pool() -> ThreadPoolExecutor:
    pool = _POOLS.get(os.getpid())
    if pool is None:
        pool = _POOLS[os.getpid()] = ThreadPoolExecutor(cores(), thread_name_prefix="qcli-probe")
    return pool


def parallel_runs(threads: int | None) -> int:
    """How many batches a probe runs at once: one per core it may use (`threads`, else every
    core), each on a single-threaded session. Measured on 2 cores, 32 samples at batch 1:
    ddddocr 288 -> 253 ms, the PP-OCRv4 recognizer 415 -> 323 ms, tashkeel 64 -> 37 ms, against
    one two-threaded session running them one after another."""
    return max(1, min(threads or cores(), cores()))


@dataclass
class Probe:
    """The float model and its outputs on `batches`, for measuring candidates against."""

    float_model: onnx.ModelProto
    batches: Sequence[Batch]  # held as `HeldBatches`
    inputs: list[InputSpec]
    threads: int | None = None
    source: str = ""  # where the samples come from, for messages and summaries
    # The float model's session, when another probe of the same model has one (`head`): a
    # session holds the weights again (a BERT-base: ~1 GB), so probes share it.
    session: Any = field(default=None, repr=False)
    verify: Verify | None = None  # verify.outputs, ctc_blank and metric (None: the defaults)
    kinds: dict[str, OutputKind] | None = None  # given by `head`: the same kinds as the whole probe
    # k-fold verification: the fold of each batch (its samples are compared on that fold's
    # candidate, calibrated without them: `measure`); None: one candidate for every batch
    folds: list[int] | None = None
    # given by `head`: per output, the float margins of every sample of the probe it heads, so
    # that a few samples' changes are judged as all of them would be (qcli.analyze.margins)
    pools: dict[str, MarginPool] | None = None
    # the target latency is judged for (qcli.target.deployment): predicted from its profile unless
    # it says measured; None: measured at batch 1 (`qcli analyze`'s timing)
    deployment: Any = None
    # given by `head`: the float outputs of `batches`, cut from the probe it heads (not run again)
    outputs: Sequence[list[np.ndarray]] | None = field(default=None, repr=False)
    reference: Sequence[list[np.ndarray]] = field(init=False)

    def __post_init__(self) -> None:
        if not isinstance(self.batches, HeldBatches):
            self.batches = HeldBatches(self.batches)
        if not self.batches:
            raise DataError(f"no samples to verify on{' in ' + self.source if self.source else ''}")
        vf = self.verify or Verify()
        # a decoder's key/value cache is neither gated nor kept (qcli.analyze.kinds.cache_outputs),
        # unless verify.outputs names it
        self.left_out = [n for n in cache_outputs(self.float_model) if n not in vf.outputs]
        self.names = [o.name for o in self.float_model.graph.output if o.name not in self.left_out]
        if self.outputs is not None:
            self.reference, self._held = self.outputs, self.session
        else:
            # held for the clock's timings (`verify.latency: measured`); else a frugal one, dropped
            held = vf.latency == "measured" and weight_bytes(self.float_model)[0] < HELD_SESSION_BYTES
            session = self.session or make_session(self.float_model, self.threads, pass_only=True, frugal=not held,
                                                   one_shape=self._batches.one_shape)
            self.reference = _reference(session, self.names, self.batches)
            self._held = session if held else None
        self._float_ms: float | None = None
        self._reference: Prediction | None = None  # the float model's predicted latency
        self._feeds: dict[str, np.ndarray] | None = None  # what latency is judged on (`feeds`)
        self._decodes = False  # those are a decoder's decode step
        if self.kinds is None:
            values = {name: _Column(self.reference, k) for k, name in enumerate(self.names)}
            self.kinds = output_kinds(self.float_model, values, vf.outputs, vf.ctc_blank, vf.sequence_trim,
                                      vf.thresholds)
        self._metric = load_metric(vf.metric) if vf.metric else None
        self._z = z_of(vf.confidence)

    @property
    def _float_session(self) -> Any:
        """The float model's session: the one the reference outputs came from, kept for the
        clock's timings (`verify.latency: measured`) and `head` probes while its weights are under
        HELD_SESSION_BYTES; otherwise made again when asked for (a decoder's 1.5 GB of weights,
        held beside each candidate's; nakdimon's 21 MB, whose session held 80 MB)."""
        return self._held or make_session(self.float_model, self.threads)

    @property
    def _batches(self) -> HeldBatches:
        assert isinstance(self.batches, HeldBatches)  # __post_init__
        return self.batches

    @property
    def samples(self) -> int:
        return sum(self._batches.sizes)

    @property
    def fold_indices(self) -> list[int]:
        """The folds this probe's batches come from ([0] when it is not folded)."""
        return sorted(set(self.folds)) if self.folds is not None else [0]

    def measure(self, candidate: onnx.ModelProto | Callable[[int], onnx.ModelProto] | Simulated,
                stop_below: float | None = None) -> Fidelity:
        """`candidate` compared with the float model on every batch; folded (`folds`): a
        function giving the candidate of each fold, each run on its own fold's batches (the
        folds one after another: one fold's model and session in memory at a time), into one
        set of figures; or `Simulated`: run on the simulation, fed each fold's inputs
        (qcli.simulation). `stop_below`: an agreement floor; the batches stop once an output
        has lost so much agreement (`_doomed`: samples changed, IoU short of 1) that its
        agreement over all of them must end below it (a miss by the verdict rule,
        qcli.analyze.verdict), and the figures are those of the samples compared so far."""
        assert self.kinds is not None  # set in __post_init__
        accs = [FidelityAccumulator(self.kinds[n], pool=(self.pools or {}).get(n), z=self._z) for n in self.names]
        topk: tuple[TopKAccumulator, TopKAccumulator] | None = None
        custom = self._metric.start() if self._metric else None
        k = next((j for j, n in enumerate(self.names) if self.kinds[n].kind is Kind.TOP1), None)
        for j, values in self._outputs(candidate):
            batch, reference = self.batches[j], self.reference[j]
            for acc, ref, value in zip(accs, reference, values, strict=True):
                acc.update(ref, value, batch.size, batch.inputs)
            if custom is not None:
                custom.update(dict(zip(self.names, reference, strict=True)), dict(zip(self.names, values, strict=True)),
                              batch)
            if batch.label is not None:
                if k is not None:
                    if topk is None:
                        classes = int(np.asarray(reference[k]).shape[1])
                        topk = (TopKAccumulator(classes), TopKAccumulator(classes))
                    topk[0].update(np.asarray(reference[k]), batch.label)
                    topk[1].update(np.asarray(values[k]), batch.label)
            if stop_below is not None and _doomed(accs, self.samples, stop_below):
                break
        outputs = tuple(output_fidelity(name, acc) for name, acc in zip(self.names, accs, strict=True))
        noise = sum(acc.sqnr.noise / max(acc.sqnr.signal, 1e-30) for acc in accs
                    if acc.floating and acc.kind is not None and acc.kind.kind is not Kind.IGNORE)
        return Fidelity(
            outputs, float(noise),
            accuracy=topk[1].top1_rate if topk else None,
            float_accuracy=topk[0].top1_rate if topk else None,
            custom=custom.result() if custom is not None else None,
        )

    def _outputs(self, candidate: onnx.ModelProto | Callable[[int], onnx.ModelProto] | Simulated,
                 ) -> Iterator[tuple[int, list[np.ndarray]]]:
        """(batch index, the candidate's outputs) for every batch, in order: the batches of one
        fold on that fold's session (one session in memory at a time; one model, as a
        weight-only candidate is for every fold: one session), `parallel` batches at a time
        (the first on this thread, the others on a pool's), each on one core: sessions of one
        thread give the same bits as one of several threads, and per-batch threads use 2 cores
        better than onnxruntime's intra-op threads on small batches (`parallel_runs`)."""
        per_fold = callable(candidate) or isinstance(candidate, Simulated)
        folds = self.folds if self.folds is not None and per_fold else [0] * len(self.batches)
        parallel = parallel_runs(self.threads)
        for fold, members in itertools.groupby(range(len(self.batches)), key=lambda j: folds[j]):
            group = list(members)
            if isinstance(candidate, Simulated):  # one session for every trial: switches and scales fed
                session, extra = candidate.session, candidate.feeds(fold)
            else:
                model = candidate(fold) if callable(candidate) else candidate
                session = make_session(model, 1 if parallel > 1 and len(group) > 1 else self.threads, pass_only=True,
                                       frugal=True, one_shape=self._batches.one_shape)
                extra = {}
            for w in range(0, len(group), parallel):
                window = group[w: w + parallel]
                feeds = [{**self.batches[j].inputs, **extra} for j in window]
                runs = [_pool().submit(session.run, self.names, f) for f in feeds[1:]]
                raws = [session.run(self.names, feeds[0]), *(r.result() for r in runs)]
                for j, raw in zip(window, raws, strict=True):
                    yield j, [as_array(v) for v in raw]
            session = None  # freed before the next fold's is made

    def ranking(self, n: int) -> Probe:
        """The probe the search ranks candidates on: the first `n` samples, and when folded no
        more than the first fold holds, so a quick trial builds and loads one fold's model, not
        two (32 samples in 4 folds: 8; docs/guides/mixed-precision.md)."""
        if self.folds is not None:
            n = min(n, sum(size for size, f in zip(self._batches.sizes, self.folds, strict=True) if f == self.folds[0]))
        return self.head(n)

    def head(self, n: int) -> Probe:
        """A probe on the first `n` samples (this one when it has no more): whole batches, the
        last one cut when it holds more. Only batches of several samples are ever cut, and
        those are stacked ones: inputs that do not stack (a recurrent state [2, N, 128], a
        scalar) come one sample a batch and are fed as they are."""
        if self.samples <= n:
            return self
        batches, outputs, taken = [], [], 0
        for j, batch in enumerate(self.batches):
            if taken >= n:
                break
            k = min(n - taken, batch.size)
            if k == batch.size:
                outputs.append(self.reference[j])
            else:  # run again: an output's batch axis need not be its first ([T, N, C] sequences)
                batch = Batch(
                    {name: a[:k] for name, a in batch.inputs.items()},
                    None if batch.label is None else batch.label[:k],
                    None if batch.outputs is None else {name: a[:k] for name, a in batch.outputs.items()},
                    batch.sources[:k],
                )
                outputs.append([as_array(v) for v in self._float_session.run(self.names, batch.inputs)])
            batches.append(batch)
            taken += k
        folds = self.folds[:len(batches)] if self.folds is not None else None
        return Probe(self.float_model, batches, self.inputs, self.threads, f"{self.source} (first {taken})",
                     session=self._held, verify=self.verify, kinds=self.kinds, folds=folds,
                     pools=self.pools or self._margin_pools(), deployment=self.deployment, outputs=outputs)

    def _margin_pools(self) -> dict[str, MarginPool]:
        """Per top-1 or sequence output, the float model's margins of every sample's decisions."""
        assert self.kinds is not None  # set in __post_init__
        pools = {}
        for k, name in enumerate(self.names):
            if self.kinds[name].kind not in MARGIN_KINDS:  # no margins: not read again (a decoder's spilled logits)
                continue
            acc = FidelityAccumulator(self.kinds[name])
            for batch, reference in zip(self.batches, self.reference, strict=True):
                value = np.asarray(reference[k])
                acc.update(value.copy(), value.copy(), batch.size)  # overwritten on the way
            if acc.margins is not None:
                pools[name] = MarginPool(acc.margins.margins, acc.samples)
        return pools

    def _prompt(self) -> dict[str, np.ndarray]:
        """The first samples at the deployment's batch (1 by default; as they come when the
        inputs do not batch)."""
        feeds, _ = timed_inputs(self.batches[0], self.inputs, self.deployment.batch if self.deployment else 1)
        return feeds

    def feeds(self) -> dict[str, np.ndarray]:
        """What latency is predicted or timed on: the first samples (`_prompt`), or a decoder's
        decode step after them (qcli.analyze.predicted.served). Made once."""
        if self._feeds is None:
            prompt = self._prompt()
            self._feeds = served(self.float_model, prompt)
            self._decodes = self._feeds is not prompt
        return self._feeds

    @property
    def decodes(self) -> bool:
        """Whether latency was judged on a decoder's decode step (`feeds`, once asked for)."""
        return self._decodes

    @property
    def predicts(self) -> bool:
        """Whether latency comes from the target profile (not this machine's clock)."""
        return self.deployment is not None and not self.deployment.measured

    def predicted_ratio(self, candidate: onnx.ModelProto) -> Ratio:
        """The profile's latency of `candidate` / the float model's: an exact Ratio (its
        interval is the point)."""
        with phase("predict"):
            ratio = self.deployment.predict(candidate, self.feeds()).us / self._reference_prediction().us
        return Ratio([round(ratio, 6)])

    def held_bytes(self, candidate: onnx.ModelProto) -> tuple[int, int]:
        """The weights onnxruntime holds to run the float model and `candidate` (the graphs it
        runs, qcli.target.executed): what a memory floor reads."""
        with phase("predict"):
            written = self.deployment.predict(candidate, self.feeds())
        return self._reference_prediction().weight_bytes, written.weight_bytes

    def take_prediction(self, prompt: dict[str, np.ndarray], feeds: dict[str, np.ndarray],
                        prediction: Prediction) -> None:
        """The float model's prediction made already (qcli.verify, while preparing) on `feeds`,
        served after `prompt`: kept with them when `prompt` is this probe's own (`_prompt`), so
        neither the decode step nor the prediction is made again."""
        own = self._prompt()
        if own.keys() == prompt.keys() and all(np.array_equal(own[k], prompt[k]) for k in own):
            self._feeds, self._decodes, self._reference = feeds, feeds is not prompt, prediction

    def _reference_prediction(self) -> Prediction:
        """The float model's prediction, made once (its model and feeds never change)."""
        if self._reference is None:
            self._reference = self.deployment.predict(self.float_model, self.feeds())
        return self._reference

    def latency_ratio(self, candidate: onnx.ModelProto, runs: int | None = None, warmup: int = 5,
                      fresh: bool = False) -> Ratio:
        """Latency of `candidate` / latency of the float model (batch 1): the median of `runs`
        alternating rounds' ratios, with its interval (`latency.Ratio`). `fresh`: against a new
        float session too (a timing again: `Ratio.retimed`). Default runs: 40, fewer (12 at
        least) when the float model's take more than TIMING_MS in all: a slow model's rounds
        vary less, and nakdimon's 40 (18.5 ms a run) took 1.9 s."""
        if self.predicts:
            return self.predicted_ratio(candidate)
        return self.timed_ratio(candidate, runs, warmup, fresh)

    def timed_ratio(self, candidate: onnx.ModelProto, runs: int | None = None, warmup: int = 5,
                    fresh: bool = False) -> Ratio:
        """`latency_ratio` as this machine's clock measures it (A/B), whatever the deployment."""
        if runs is None:
            runs = max(TIMING_ROUNDS[0], min(TIMING_ROUNDS[1], int(TIMING_MS / max(self.float_ms(), 1e-3))))
        session = make_session(candidate, self.threads, timing=True)
        reference = make_session(self.float_model, self.threads) if fresh else self._float_session
        feeds = self.feeds()
        speed = measure(
            lambda: reference.run(None, feeds), lambda: session.run(None, feeds),
            runs=runs, warmup=warmup, batch=1, threads=self.threads,
        )
        return paired(speed)

    def float_ms(self) -> float:
        """Latency of the float model in ms: its fastest run at batch 1 (measured once).

        The fastest, not the median: this decides whether the model is large enough for a
        latency floor (`verify.min_float_ms`), and interference from other work only ever adds
        time; on a shared 2-core VM the median of a 0.03 ms model was seen at over 0.1 ms. A
        model whose 20 runs take under 0.2 s is run in three rounds of 20, 20 ms apart, so that
        one stretch of stolen CPU time cannot slow every run (it did once in CI)."""
        if self._float_ms is None and self.predicts:
            with phase("predict"):
                self._float_ms = self._reference_prediction().ms
        if self._float_ms is None:
            import time

            feeds, session = self.feeds(), self._float_session
            for _ in range(3):
                session.run(None, feeds)
            fastest = float("inf")
            for round_ in range(3):
                if round_:
                    time.sleep(0.02)
                begin = time.perf_counter_ns()
                for _ in range(20):
                    start = time.perf_counter_ns()
                    session.run(None, feeds)
                    took = time.perf_counter_ns() - start
                    fastest = min(fastest, took)
                if time.perf_counter_ns() - begin >= 200_000_000:
                    break
            self._float_ms = fastest / 1e6
        return self._float_ms

    def node_runs(self, models: list[onnx.ModelProto]) -> list[dict[str, np.ndarray]]:
        """Per model, each node's kernel time (µs) in each profiled run, the models' runs
        interleaved (`node_runs`): 20 runs, fewer (5 at least) when the float model's runs take
        more than PROFILE_MS in all; the profile's JSON, not the runs, is the cost: a long run
        records an event per kernel call (a Loop body's nodes once per iteration)."""
        if self.predicts:
            feeds = self.feeds()
            with phase("predict"):
                return [{n: np.array([us]) for n, us in self.deployment.predict(m, feeds).nodes.items()}
                        for m in models]
        runs = max(PROFILE_RUNS[0], min(PROFILE_RUNS[1], int(PROFILE_MS / max(self.float_ms(), 1e-3))))
        with phase("profile"):
            return node_runs(models, self.feeds(), runs, self.threads)


def _reference(session: Any, names: list[str], batches: Sequence[Batch]) -> Sequence[list[np.ndarray]]:
    """The float outputs of each batch: in memory, or `Spilled` when the first batch's times the
    batches pass REFERENCE_HELD_BYTES (a decoder's logits: 16 MB a 128-token chunk)."""
    first = [as_array(v) for v in session.run(names, batches[0].inputs)]
    rest = (batches[j] for j in range(1, len(batches)))  # one batch read back at a time (`HeldBatches`)
    if sum(a.nbytes for a in first) * len(batches) <= REFERENCE_HELD_BYTES:
        return [first, *([as_array(v) for v in session.run(names, b.inputs)] for b in rest)]
    spilled = Spilled()
    spilled.append(first)
    del first
    for batch in rest:
        spilled.append([as_array(v) for v in session.run(names, batch.inputs)])
    return spilled


class _Column(Sequence[np.ndarray]):
    """Output `k` of each batch of a reference, read when asked for."""

    def __init__(self, reference: Sequence[list[np.ndarray]], k: int) -> None:
        self._reference, self._k = reference, k

    def __len__(self) -> int:
        return len(self._reference)

    @overload
    def __getitem__(self, j: int) -> np.ndarray: ...
    @overload
    def __getitem__(self, j: slice) -> list[np.ndarray]: ...
    def __getitem__(self, j: int | slice) -> np.ndarray | list[np.ndarray]:
        if isinstance(j, slice):
            return [self[i] for i in range(*j.indices(len(self)))]
        return self._reference[j][self._k]


def _doomed(accs: list[FidelityAccumulator], total: int, floor: float) -> bool:
    """Whether an output's agreement lost so far (samples changed; a mask's or map's IoU
    short of 1, `FidelityAccumulator.lost`) leaves its agreement over `total` samples below
    `floor` whatever the rest do.

    >>> acc = FidelityAccumulator(OutputKind(Kind.TOP1, "class scores"))
    >>> acc.update(np.eye(3), np.eye(3)[[1, 1, 2]], 3)  # the first sample's class changed
    >>> _doomed([acc], 32, 0.99), _doomed([acc], 100, 0.99), _doomed([acc], 101, 0.99)
    (True, False, False)
    >>> mask = FidelityAccumulator(OutputKind(Kind.MASK, "mask"))
    >>> mask.update(np.array([[0.9, 0.9]] * 3), np.array([[0.9, 0.1]] * 3), 3)  # each IoU 0.5
    >>> _doomed([mask], 100, 0.99), _doomed([mask], 200, 0.99)
    (True, False)
    """
    return any((lost := acc.lost()) is not None and total - lost < floor * total for acc in accs)


def node_runs(models: list[onnx.ModelProto], feeds: dict[str, np.ndarray], runs: int = 20,
              threads: int | None = None) -> list[dict[str, np.ndarray]]:
    """onnxruntime's profiler on `models` at once: per model, each node's kernel µs in each of
    `runs` runs (by node name). The models take turns, run by run, the order alternating (A B,
    B A, ...), so what drifts during a profile (clocks, a neighbour's load) hits every model
    alike and a run's times can be compared with the same run's of another model."""
    with tempfile.TemporaryDirectory(prefix="qcli-profile-") as tmp:
        sessions = [make_session(m, threads, profile=Path(tmp) / f"profile{k}", timing=True)
                    for k, m in enumerate(models)]
        for session in sessions:
            for _ in range(3):
                session.run(None, feeds)
        for r in range(runs):
            for session in sessions if r % 2 == 0 else sessions[::-1]:
                session.run(None, feeds)
        return [_per_run(json.loads(Path(s.end_profiling()).read_text()), runs) for s in sessions]


def _per_run(events: list[dict], runs: int) -> dict[str, np.ndarray]:
    """A profile's events -> each node's summed kernel µs in each of the last `runs` runs (the
    profile lists runs in order: the warm-up runs before them are skipped)."""
    starts = sorted(e["ts"] for e in events if e.get("cat") == "Session" and e.get("name") == "model_run")[-runs:]
    per_run: dict[str, np.ndarray] = {}
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time") and starts and e["ts"] >= starts[0]:
            run = bisect.bisect_right(starts, e["ts"]) - 1
            row = per_run.setdefault(e["name"][: -len("_kernel_time")], np.zeros(len(starts)))
            row[run] += e["dur"]
    return per_run
