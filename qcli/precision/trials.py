"""Trials: build a candidate (the model with some units promoted, or one unit alone: `Alone`)
and measure it, once.

Every measurement (fidelity, latency, kernel times) is cached by the candidate's choices, so a
search never pays twice for one candidate; independent candidates run on the executor's workers
and land in the cache in order, so nothing downstream depends on the number of workers. Nor
twice for one model: choices that build the same model as a candidate measured already (a unit
sent back to int8 whose neighbours are all float stays float: the prune's trials of mostly-float
models) take its fidelity, without a trial. The model is known by a digest of the first one the
probe would run (the one model, or its first fold's: a plan comes from the config and the graph
alone, the tables only fill in its ranges, so one fold's model the same means every fold's is).
A unit's speed cost is measured, not assumed: onnxruntime's profiler gives each node's kernel
time in each run, and a unit's time is its own node's (or a fusion named after it) plus its
share of the Q/DQ nodes of its tensors; cost = time promoted - time int8 over the same runs
(negative: faster unquantized; 0 when the runs cannot tell them apart, `paired_cost`).
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from qcli.analyze.fidelity import Fidelity
from qcli.analyze.latency import Ratio
from qcli.analyze.probe import Probe
from qcli.calibrate.table import CalibrationTable
from qcli.config import Config
from qcli.dynamic import NODE_SUFFIXES, QUANTIZER_SUFFIX
from qcli.errors import CalibrationError, InternalError, ModelError
from qcli.lazy import deferred_bytes
from qcli.model import serialized_size
from qcli.phases import phase
from qcli.precision.simulated import Simulator
from qcli.precision.units import PROMOTIONS, Choices, Costs, Unit, alone, find_units, promoted_config
from qcli.prepare import PrepareResult
from qcli.runtime import inlined
from qcli.simulation import Simulated

if TYPE_CHECKING:
    from qcli.quantize import QuantizeResult


@dataclass(frozen=True)
class Alone:
    """A candidate with one unit quantized as the config quantizes it and every other node float
    (`units.alone`): what the unit costs on its own (the sensitivity report)."""

    unit: str


Candidate = Choices | Alone  # a candidate model: the config with these choices, or one unit alone


def _reads_no_ranges(built: QuantizeResult, config: Config) -> bool:
    """Whether a candidate's model takes nothing from the calibration table, so that every
    fold's is the same (a mostly-float or weight-only candidate): no calibrated or observed
    tensor, and no weight rounding or recovery step that reads the calibration statistics."""
    return (not built.plan.observed_tensors and not config.recovery.steps
            and not config.weights.from_data)


def _key(candidate: Candidate) -> Alone | frozenset:
    return candidate if isinstance(candidate, Alone) else frozenset(candidate.items())


def _digest(model: onnx.ModelProto) -> bytes:
    """What tells two built models' computations apart: a digest of their graph, functions and
    opsets (not their metadata, which records the config that made each)."""
    h = hashlib.sha256(model.graph.SerializeToString())
    for part in (*model.functions, *model.opset_import):
        h.update(part.SerializeToString())
    return h.digest()


SETTLE_TIMINGS = 3  # timings (of 40 rounds at most: Probe.latency_ratio) for one latency verdict
SPEED_TIE = 2.0  # µs: a unit whose int8 form is slower by less than this is a tie (stays int8)


@dataclass
class Trials:
    """Builds and measures candidate models; every measurement is cached by its choices."""

    model: onnx.ModelProto  # as the user gave it
    prepared: PrepareResult
    config: Config
    table: CalibrationTable
    probe: Probe
    units: list[Unit]
    max_trials: int = 200
    time_budget: float = 300.0  # seconds
    progress: Callable[[int], None] | None = None
    ceiling: float | None = None  # latency ratio worth confirming above
    count: int = 0
    stopped: str | None = None
    quick_probe: Probe | None = None  # a few of the probe's samples, for ranking
    executor: Any = None  # qcli.executor: independent trials run on its workers
    force: bool = False  # prepare's --force, for workers that prepare the model again
    simulate: bool = False  # quick trials on the simulation where it emulates them (qcli.precision.simulated: off)
    # The caches: not init fields, so `dataclasses.replace` (another config's trials) starts empty
    _fidelity: dict[tuple, Fidelity | None] = field(default_factory=dict, init=False)
    _latency: dict[frozenset, tuple[Ratio, int]] = field(default_factory=dict, init=False)  # ratio, timings
    _demoted: dict[Alone | frozenset, int] = field(default_factory=dict, init=False)
    _size: dict[Alone | frozenset, int] = field(default_factory=dict, init=False)  # bytes as written
    _shared: _Context | None = field(default=None, init=False)  # what workers set up from
    _built: dict[Alone | frozenset, QuantizeResult] = field(default_factory=dict, init=False)  # recent, by choices
    _same: dict[tuple[bytes, bool], tuple] = field(default_factory=dict, init=False)  # (digest, quick) -> key
    _digests: dict[tuple, bytes | None] = field(default_factory=dict, init=False)  # fidelity key -> model digest
    _stopped: set[tuple] = field(default_factory=set, init=False)  # fidelity keys measured in part (`fidelity`)
    _simulator: Simulator | bool = field(default=False, init=False)  # False: not asked yet; True: none

    def __post_init__(self) -> None:
        self.started = time.monotonic()

    def exhausted(self) -> bool:
        """Whether the trial budget is spent. Only the count decides: a clock would make the
        model written depend on the machine's load (`overran` reports the time instead)."""
        if self.count >= self.max_trials:
            self.stopped = f"max trials ({self.max_trials}) reached"
        return self.stopped is not None

    def overran(self) -> str | None:
        """A note when the search took longer than `time_budget` (reported, never decided on)."""
        took = time.monotonic() - self.started
        if took <= self.time_budget:
            return None
        return (f"the search took {took:.0f} s, past its time budget ({self.time_budget:g} s); the budget no "
                "longer stops it (the result would depend on the machine's load): bound it with max_trials")

    def build(self, choices: Candidate) -> QuantizeResult:
        """The candidate quantized (a QuantizeResult). The last two are kept: a candidate's
        fidelity, latency and profile are asked for one after another."""
        key = _key(choices)
        if key not in self._built:
            if len(self._built) >= 2:
                del self._built[next(iter(self._built))]
            self._built[key] = self._quantize(choices, self.table)
        return self._built[key]

    def _quantize(self, candidate: Candidate, table: CalibrationTable, lean: bool = False) -> QuantizeResult:
        """The candidate built with `table`; `lean`: for a session only (qcli.quantize)."""
        from qcli.quantize import quantize

        with phase("build"):
            if isinstance(candidate, Alone):
                unit = next(u for u in self.units if u.node == candidate.unit)
                return quantize(self.model, self.config, table, prepared=self.prepared,
                                restrict=lambda plan, graph: alone(plan, graph, unit), lean=lean)
            return quantize(self.model, promoted_config(self.config, candidate, self.units), table,
                            prepared=self.prepared, lean=lean)

    def measured(self, choices: Candidate, probe: Probe) -> tuple[onnx.ModelProto | Callable[[int], onnx.ModelProto],
                                                                    Callable[[], QuantizeResult], bytes]:
        """What `probe` measures of the candidate: the model built with `table`, or (k-fold:
        `table.folds`, the probe's batches tagged by fold) the function building fold k's
        model from the table without that fold, as the probe asks for it (the first fold's
        built already), or that model alone when it reads no ranges (`_reads_no_ranges`: every
        fold's is the same, one session runs them all); the function giving one of them built
        (for its plan); and the digest of the first model the probe runs (module docstring)."""
        if not self.table.folds:
            built = self.build(choices)
            return built.model, lambda: built, _digest(built.model)
        folds: dict[int, QuantizeResult] = {}

        def fold_model(k: int) -> onnx.ModelProto:
            if k not in folds:
                folds.clear()  # the last one only: one fold's model in memory at a time
                folds[k] = self._quantize(choices, self.table.folds[k], lean=True)  # measured, never kept
            return folds[k].model

        first = fold_model(probe.folds[0] if probe.folds else 0)
        built = next(iter(folds.values()))
        if _reads_no_ranges(built, self.config):  # every fold's model is this one: one session for all
            return first, lambda: built, _digest(first)
        return fold_model, lambda: next(iter(folds.values())), _digest(first)

    def seed(self, int8: QuantizeResult) -> None:
        """The all-int8 candidate (choices {}) when the caller built it already."""
        self._built[frozenset()] = int8

    def fidelity(self, choices: Candidate, quick: bool = False, stop_below: float | None = None) -> Fidelity | None:
        """The candidate's fidelity (on the quick probe's few samples with `quick`: enough to
        rank, not to check a floor); None when it cannot be built from the calibration.
        `stop_below` (`Probe.measure`): for a caller that only asks whether the candidate meets
        that agreement floor (a confirmation); a miss may then be measured on fewer samples (a
        k-fold one without building the later folds' models): such a figure stands for no other
        model of the same bytes, and a caller asking without `stop_below` has it measured whole."""
        key = (_key(choices), quick)
        if key in self._stopped and stop_below is None:  # a miss measured in part, wanted whole
            self._stopped.discard(key)
            del self._fidelity[key]
        if key not in self._fidelity:
            try:
                probe = self.quick_probe if quick and self.quick_probe is not None else self.probe
                simulator = self.simulator() if quick else None
                simulated = simulator.candidate(choices.unit if isinstance(choices, Alone) else choices, probe) \
                    if simulator is not None else None
                candidate: Simulated | onnx.ModelProto | Callable[[int], onnx.ModelProto]
                if simulated is not None:
                    candidate, demoted, digest = simulated
                else:
                    candidate, built, digest = self.measured(choices, probe)
                    kept = {d.name for d in built().plan.nodes if d.quantized and not d.reason}
                    demoted = sum(1 for u in self.units if u.node not in kept)
                if (digest, quick) in self._same:  # no trial: the model was measured (module docstring)
                    self._record(key, None, demoted, digest)
                    return self._fidelity[key]
                with built_by_qcli(), phase("simulate" if simulated is not None else "measure"):
                    f = probe.measure(candidate, stop_below)
                stopped = any(o.samples < probe.samples for o in f.outputs)
                self._record(key, f, demoted, None if stopped else digest)
                if stopped:
                    self._stopped.add(key)
            except CalibrationError:
                self._record(key, None, None, None)
            if self.progress is not None:
                self.progress(1)
        return self._fidelity[key]

    def simulator(self) -> Simulator | None:
        """The search's simulation, built on the all-int8 candidate when first asked for; None
        when it is off or would not compute what the builds write."""
        if self._simulator is False:
            built = Simulator.of(self.prepared, self.config, self.table, self.units, self.build({}),
                                 self.probe.threads) if self.simulate else None
            self._simulator = built or True
        return self._simulator if isinstance(self._simulator, Simulator) else None

    def _record(self, key: tuple, f: Fidelity | None, demoted: int | None, digest: bytes | None) -> None:
        """A candidate's measurement (`demoted`: the units it leaves unquantized; `digest`: its
        model's, None when it could not be built): a trial, or, for a model measured already,
        that model's fidelity and no trial."""
        same = self._same.get((digest, key[1])) if digest is not None else None
        if same is not None:
            f = self._fidelity[same]
        else:
            self.count += 1
            if digest is not None:
                self._same[(digest, key[1])] = key
        self._fidelity[key] = f
        self._digests[key] = digest
        if demoted is not None and not isinstance(key[0], Alone):  # alone, every other unit is float
            self._demoted[key[0]] = demoted

    def fidelity_many(self, candidates: Sequence[Candidate], quick: bool = False) -> list[Fidelity | None]:
        """`fidelity` of independent candidates, on the executor's workers when there are
        several: each worker gets one contiguous chunk and sets up its own copy of the trials
        once (prepared model, probe, float outputs); results land in this cache in order, so
        what follows does not depend on the number of workers (nor do the trials counted: a
        model measured twice by workers counts once, with its first measurement)."""
        todo: list[Candidate] = []
        for c in candidates:
            if (_key(c), quick) not in self._fidelity and c not in todo:
                todo.append(c)
        workers = getattr(self.executor, "workers", 1)
        if workers > 1 and len(todo) > 1:
            context = self._context()
            size = -(-len(todo) // workers)
            chunks = [todo[i: i + size] for i in range(0, len(todo), size)]
            tasks = [(context, [c if isinstance(c, Alone) else tuple(sorted(c.items())) for c in chunk], quick,
                      self.executor.threads) for chunk in chunks]
            for chunk, results in zip(chunks, self.executor.map(_run_trials, tasks), strict=True):
                for c, (f, demoted, digest) in zip(chunk, results, strict=True):
                    self._record((_key(c), quick), f, demoted, digest)
            if self.progress is not None:
                self.progress(len(todo))
        return [self.fidelity(c, quick) for c in candidates]

    def _context(self) -> _Context:
        if self._shared is None:
            import uuid

            quick = self.quick_probe.samples if self.quick_probe is not None else self.probe.samples
            self._shared = _Context(uuid.uuid4().hex, inlined(self.model).SerializeToString(), self.config, self.table,
                                    list(self.probe.batches), self.probe.inputs, quick, self.force, self.probe.folds)
        return self._shared

    def unit_noise(self, choices: Choices, nodes: list[str]) -> dict[str, float] | None:
        """Each of `nodes`' own noise in the candidate `choices` (qcli.precision.noise): not a
        trial, and not counted as one. None when the candidate cannot be built or run on one
        sample (a first guess: the caller goes on without it)."""
        from qcli.precision.noise import unit_noise

        with phase("noise"):
            try:
                return unit_noise(self, nodes, choices)
            except (CalibrationError, ModelError):
                return None

    def affordable(self, n: int) -> bool:
        """Whether `n` more trials fit in half of the trials left. Counted, not timed: what the
        search measures (one trial per unit, or blocks) must not depend on how busy the machine
        was; nor when it stops (`exhausted`)."""
        return n <= (self.max_trials - self.count) / 2

    def demoted(self, choices: Candidate) -> int:
        """How many units the candidate leaves unquantized: promoting one node can take its
        neighbours along (a node whose output only feeds float nodes stays float too)."""
        if isinstance(choices, Alone):
            return len(self.units) - 1
        return self._demoted.get(frozenset(choices.items()), len(choices))

    def latency(self, choices: Choices, settle: bool = True) -> Ratio:
        """Latency ratio to the float model, with its interval (`latency.Ratio`). A ratio above
        `ceiling` is timed again, up to SETTLE_TIMINGS times in all (fresh sessions of both
        models each time, `Ratio.retimed`), while the pooled median stays above it: one timing
        on a busy machine, or with unlucky thread placement, can be off by several percent in
        either direction, with a narrow interval. The interval spanning the timings decides
        (`Goal.fast`): measurably slower only when every timing says so. Without `settle`, one
        timing (enough to see a model that is not faster than float); asked again with it, the
        further timings follow."""
        key = frozenset(choices.items())
        ratio, timings = self._latency.get(key, (None, 0))
        wanted = SETTLE_TIMINGS if settle and not self.probe.predicts else 1  # a prediction is exact
        if ratio is None or (timings < wanted and self.ceiling is not None and ratio > self.ceiling):
            model = self.build(choices).model
            with built_by_qcli(), phase("time"):
                if ratio is None:
                    ratio, timings = self.probe.latency_ratio(model), 1
                while timings < wanted and self.ceiling is not None and ratio > self.ceiling:
                    ratio, timings = ratio.retimed(self.probe.latency_ratio(model, fresh=True)), timings + 1
            self._latency[key] = (ratio, timings)
        return ratio

    def size(self, choices: Choices) -> int:
        """The candidate's bytes as written (the size budget's measure): its protobuf plus the
        weights it leaves in the input's external data. A build, not a trial: nothing runs."""
        key = _key(choices)
        if key not in self._size:
            model = self.build(choices).model
            self._size[key] = serialized_size(model) + deferred_bytes(model)
        return self._size[key]

    def costs(self, candidates: Collection[str], base: Choices | None = None) -> Costs:
        """Per unit: the promotion among `candidates` with the least measured cost, and that
        cost in µs per run (time promoted - time int8, `paired_cost`: 0 when the runs cannot
        tell them apart; negative: faster promoted); `dynamic` is timed on the units with a
        dynamic form. `base`: the choices the int8 times are measured in (default: all int8);
        a unit's int8 time depends on its neighbours (whether its Q/DQ pairs fuse). Each
        promoted model is profiled taking turns with the int8 one (`Probe.node_runs`). A
        promotion the calibration cannot build (int16 around activations it did not measure:
        a weight-only config's) is left out, as `fidelity` leaves such candidates unmeasured.
        No promotion among `candidates`: none."""
        if not any(p in candidates for p in PROMOTIONS):
            return {}
        int8_model = self.build(base or {}).model
        best: Costs = {}
        # float first: another candidate replaces it only when clearly cheaper (ties go to float,
        # the more accurate one, so timing noise does not flip the choice)
        for precision in sorted((p for p in PROMOTIONS if p in candidates), key=lambda p: p != "float"):
            takers = [u for u in self.units if precision == "float" or _takes(u, precision)]
            if not takers:
                continue
            if precision == "float":
                promoted = self.prepared.model
            else:
                try:
                    promoted = self.build({u.node: precision for u in takers}).model
                except CalibrationError:
                    continue
            with built_by_qcli():
                int8, times = (attribute(t, self.units) for t in self.probe.node_runs([int8_model, promoted]))
            for u in takers:
                cost = paired_cost(times.get(u.node), int8.get(u.node))
                if u.node not in best or cost < best[u.node][1] - max(SPEED_TIE, 0.1 * abs(best[u.node][1])):
                    best[u.node] = (precision, cost)
        return best


def paired_cost(promoted: np.ndarray | None, int8: np.ndarray | None) -> float:
    """A unit's cost from the same runs' kernel times (µs) promoted and in int8: the end of the
    ~95% interval of the median difference nearest 0 (the sign test's order statistics, as a
    latency `Ratio`'s), 0 when it holds 0. One profile's medians differ by a few µs a unit from
    the next profile's on a model of µs-sized kernels (tashkeel: 61-123 of its 128 units
    measured slower in int8 in four profiles of the same two models), so a choice made on them
    changed from run to run; a difference the runs cannot tell from 0 is now a tie.

    >>> paired_cost(np.array([5.0, 6, 7, 5, 6]), np.array([9.0, 9, 9, 9, 9]))
    -2.0
    >>> paired_cost(np.array([5.0, 12, 7, 5, 6]), np.array([9.0, 9, 9, 9, 9]))
    0.0
    """
    if promoted is None and int8 is None:
        return 0.0
    diff = (0.0 if promoted is None else promoted) - (0.0 if int8 is None else int8)
    interval = Ratio(np.atleast_1d(diff).tolist())
    return interval.high if interval.high < 0 else interval.low if interval.low > 0 else 0.0


def _takes(unit: Unit, promotion: str) -> bool:
    """Whether `unit` can take `promotion` besides float (a table or a half node none; dynamic
    needs its form)."""
    return not unit.table and not unit.half and (promotion != "dynamic" or unit.dynamic)


@contextmanager
def built_by_qcli() -> Iterator[None]:
    """onnxruntime refusing a model qcli built is a bug in qcli, not a fault of the user's model
    (which loaded: the probe ran it), whatever the hint of the session's ModelError says."""
    try:
        yield
    except ModelError as exc:
        raise InternalError(f"onnxruntime refuses a model qcli built: {exc.message}") from exc


@dataclass(frozen=True)
class _Context:
    """What a worker needs to run trials itself (sent once per chunk of trials)."""

    key: str  # one search: a worker keeps its setup for this key
    model: bytes
    config: Config
    table: CalibrationTable
    batches: list
    inputs: list
    quick: int
    force: bool
    folds: list[int] | None = None  # the fold of each batch


_WORKER_TRIALS: dict[str, Trials] = {}


def _run_trials(task) -> list[tuple[Fidelity | None, int | None, bytes | None]]:
    """Worker side of `Trials.fidelity_many`: set up once per search, then measure a chunk."""
    from qcli.plan import make_plan
    from qcli.quantize import prepare_for

    context, chunk, quick, threads = task
    trials = _WORKER_TRIALS.get(context.key)
    if trials is None:
        _WORKER_TRIALS.clear()
        model = onnx.load_from_string(context.model)
        prepared = prepare_for(model, context.config, force=context.force)
        probe = Probe(model, context.batches, context.inputs, threads, verify=context.config.verify,
                      folds=context.folds)
        units = find_units(prepared.model, make_plan(prepared.model, context.config))
        trials = Trials(model, prepared, context.config, context.table, probe, units,
                        max_trials=1 << 30, time_budget=float("inf"), quick_probe=probe.head(context.quick))
        _WORKER_TRIALS[context.key] = trials
    results = []
    for item in chunk:
        candidate = item if isinstance(item, Alone) else dict(item)
        key = (_key(candidate), quick)
        f = trials.fidelity(candidate, quick)
        results.append((f, trials._demoted.get(key[0]), trials._digests.get(key)))
    return results


def attribute(times: dict[str, Any], units: list[Unit]) -> dict[str, Any]:
    """Kernel times by node name -> time per unit: the unit's own node (or an onnxruntime fusion
    named `<node>/...`), plus an even share of the Q/DQ nodes of each tensor it touches. Times
    are floats or arrays (one per run), summed alike.

    >>> units = [Unit("/conv", "Conv", 0, frozenset({"x", "y"})), Unit("/fc", "Gemm", 1, frozenset({"y", "z"}))]
    >>> attribute({"/conv": 10.0, "/fc/MatMulNBits": 4.0, "y_Q": 2.0, "x_DQ": 1.0}, units)
    {'/conv': 12.0, '/fc': 5.0}
    >>> attribute({"/fc_MatMulInteger": 3.0, "y_DynamicQuantize": 2.0}, units)
    {'/fc': 4.0, '/conv': 1.0}
    >>> attribute({"/conv_token_12": 7.0}, units)  # renamed by onnxruntime's layout transformer (NHWC)
    {'/conv': 7.0}
    """
    names = {m: u.node for u in units for m in u.nodes}  # a unit's nodes (its mates too) -> the unit
    owners: dict[str, list[str]] = {}
    for u in units:
        for t in u.tensors:
            owners.setdefault(t, []).append(u.node)
    out: dict[str, Any] = {}
    for named, us in times.items():
        name = re.sub(r"_token_\d+$", "", named)
        if name in names:
            targets = [names[name]]
        elif fused := [n for n in names if name.startswith(n + "/")]:
            targets = [names[max(fused, key=len)]]
        elif own := next((name[: -len(s)] for s in NODE_SUFFIXES if name.endswith(s) and name[: -len(s)] in names),
                         None):  # a node of a dynamic unit's replacement
            targets = [names[own]]
        else:
            tensor = next((name[: -len(s)] for s in ("_dequantized_DQ", "_Q", "_DQ", QUANTIZER_SUFFIX)
                           if name.endswith(s)), None)
            targets = owners.get(tensor, []) if tensor is not None else []
        for n in targets:
            out[n] = out.get(n, 0.0) + us / len(targets)
    return out

