"""`qcli target measure`: the kernel costs of the machine it runs on, as a profile to commit.

Each micro-model of qcli.target.bench runs WARMUP times, then until it has RUNS runs or
TIME_PER_MODEL seconds (at least MIN_RUNS) under onnxruntime's profiler, in each of ROUNDS
passes over the suite; a kernel call's time is the median over the passes of its runs'
median. The calls are grouped by class and op (`conv.i8:QLinearConv`) and by class alone
(qcli.target.kernels), and each group's terms are fit to them (`fit`: non-negative, least
relative error; a compute class under each of PACKS, keeping the packing whose padded
products fit best; an op seen fewer than MIN_CALLS times is priced by its class). `run_us`,
a session.run's own cost, is a one-Relu model's wall time less the per-node slope of a
CHAIN-Relu one. The profiler slows what it times, parallel int8 kernels most (on the PP-OCRv4
detector its kernels sum to 1.43x the unprofiled int8 run, 1.09x the float one), which is
where predictions miss. Tried and set aside (benchmarks/target.py, docs/benchmarks.md):
taking the profiler's cost off each call to the unprofiled run's wall time (4 of 17 within
10%, against 4-7 across runs); fitting every entry at once to the micro-models' unprofiled
wall times (8 of 17 in one form, but the QLinearAdd of an NHWC graph priced at 83 us; 3 of 17
with three predicted faster while measured slower once the features a key does not vary were
dropped): unstable; taking a Relu's profiler cost (3-4.6 us a call against 0.25 us
unprofiled) off every call before or after the fit (10 of 23 within 10% against 14; 18-23 of
28 against 21-24), or refitting each entry's fixed cost to the micro-models' walls (13-20 of
28, moving with each re-measure). This module reads the clock: its output is a measurement;
what decides reads the file it writes. What does close the gap is timing the user's own
graphs, once, on the target: qcli.target.calibrated (`qcli target measure --model`).
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from qcli.runtime import make_session
from qcli.target import bench
from qcli.target.executed import executed
from qcli.target.kernels import FEATURES, Kernel
from qcli.target.profile import FORMAT, Cost, Profile, cpu_flags

WARMUP, MIN_RUNS, RUNS, TIME_PER_MODEL = 5, 15, 200, 0.25
ROUNDS = 3  # passes over the suite, each kernel's time the median of theirs
CHAIN = 64
MIN_CALLS = 8  # an op's own entry is fit on at least this many calls
PACKS: tuple[tuple[int, int] | None, ...] = (None, (4, 8), (4, 16))  # how compute kernels may pad K and N
# the flags that name an x86-64 profile's ISA, most specific first (`isa_name`)
ISA_FLAGS = (("avx512_vnni", "avx512vnni"), ("avx_vnni", "avxvnni"), ("avx512f", "avx512"), ("avx2", "avx2"))


def isa_name(flags: frozenset[str]) -> tuple[str, list[str]]:
    """A profile name for this CPU and the flags it rests on.

    >>> isa_name(frozenset({"avx2", "avx512f", "avx512_vnni"}))
    ('x86-64-avx512vnni', ['avx512_vnni'])
    """
    for flag, name in ISA_FLAGS:
        if flag in flags:
            return f"x86-64-{name}", [flag]
    return f"{platform.machine().lower() or 'cpu'}-baseline", []


def timed_kernels(model: onnx.ModelProto, feeds: dict[str, np.ndarray], threads: int | None,
                  kernels: list[Kernel] | None = None) -> list[tuple[Kernel, float]]:
    """Each kernel call of one run (`kernels`, if known already: `executed`'s) and its median
    µs over the profiled runs."""
    kernels = executed(model, feeds, threads) if kernels is None else kernels
    with tempfile.TemporaryDirectory(prefix="qcli-measure-") as tmp:
        session = make_session(model, threads, profile=Path(tmp) / "profile", timing=True)
        runs, start = 0, time.perf_counter()
        while runs < WARMUP + MIN_RUNS or (runs < WARMUP + RUNS and time.perf_counter() - start < TIME_PER_MODEL):
            session.run(None, feeds)
            runs += 1
        events = json.loads(Path(session.end_profiling()).read_text())
    durations: dict[str, list[float]] = {}
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            durations.setdefault(e["name"][: -len("_kernel_time")], []).append(float(e["dur"]))
    return [(k, float(np.median(durations[k.node][WARMUP:] or durations[k.node]))) for k in kernels
            if k.node in durations]


def wall_us(model: onnx.ModelProto, feeds: dict[str, np.ndarray], threads: int | None) -> float:
    """The median wall µs of a session.run of `model`."""
    session = make_session(model, threads, timing=True)
    times: list[float] = []
    begin = time.perf_counter()
    while len(times) < WARMUP + MIN_RUNS or (len(times) < WARMUP + RUNS
                                              and time.perf_counter() - begin < TIME_PER_MODEL):
        start = time.perf_counter_ns()
        session.run(None, feeds)
        times.append((time.perf_counter_ns() - start) / 1e3)
    return float(np.median(times[WARMUP:]))


def _chain(n: int) -> onnx.ModelProto:
    """n Relus in a row on four elements."""
    names = ["x", *(f"t{k}" for k in range(n - 1)), "y"]
    nodes = [helper.make_node("Relu", [names[k]], [names[k + 1]], name=f"relu{k}") for k in range(n)]
    value = [bench._t("x", TensorProto.FLOAT, [1, 4])], [bench._t("y", TensorProto.FLOAT, [1, 4])]
    return bench._model(nodes, *value, [])


def run_overhead(threads: int | None) -> float:
    """A session.run's own cost: a one-Relu model's wall time less a Relu's (the per-node slope
    of a CHAIN-Relu model), all on four elements."""
    feeds = {"x": np.ones((1, 4), np.float32)}
    one, many = wall_us(_chain(1), feeds, threads), wall_us(_chain(CHAIN), feeds, threads)
    return round(max(one - max(many - one, 0.0) / (CHAIN - 1), 0.0), 3)


def fit(kernels: list[Kernel], times: list[float], features: tuple[str, ...] = FEATURES,
        pack: tuple[int, int] | None = None) -> dict[str, float]:
    """Non-negative terms (µs per unit of each of `features`) minimising the squared relative
    error over these calls: least squares with the most negative term dropped until none is. A
    feature the calls do not vary (a QLinearAdd's constant scale bytes, an elementwise op's
    rows at one shape) says nothing apart from the fixed cost: left out, not fit to noise.

    >>> ks = [Kernel("n", "Conv", "conv.f32", work=w, moved=m, rows=4) for w, m in ((100, 10), (1000, 20), (5000, 10))]
    >>> fit(ks, [1 + 0.01 * k.work + 0.1 * k.moved for k in ks])
    {'call': 1.0, 'mac': 0.01, 'moved': 0.1}
    """
    x = np.array([k.features(pack) for k in kernels], dtype=np.float64)
    t = np.maximum(np.array(times, dtype=np.float64), 0.01)
    scale = np.maximum(x.max(axis=0), 1e-12)
    a = x / scale / t[:, None]
    active = [j for j in range(x.shape[1]) if FEATURES[j] in features and (j == 0 or np.ptp(x[:, j]) > 0)]
    while True:
        coef = np.linalg.lstsq(a[:, active], np.ones(len(t)), rcond=None)[0] if active else np.zeros(0)
        if (coef >= 0).all():
            break
        del active[int(np.argmin(coef))]
    return {FEATURES[j]: float(f"{c / scale[j]:.4g}") for j, c in zip(active, coef, strict=True) if c > 0}


def fitted(key: str, kernels: list[Kernel], times: list[float]) -> Cost:
    """An entry's cost: its terms (`fit`) under each of PACKS a compute class may have, the
    one with the least squared relative error (ties: the earlier)."""
    family = key.partition(".")[0]
    best: tuple[float, Cost] | None = None
    for pack in PACKS if family in ("conv", "nconv", "matmul") else (None,):
        cost = Cost(terms=fit(kernels, times, _features(key), pack), pack=pack)
        error = float(sum((cost.us(k) / max(t, 0.01) - 1) ** 2 for k, t in zip(kernels, times, strict=True)))
        if best is None or error < best[0] * (1 - 1e-9):
            best = (error, cost)
    assert best is not None
    return best[1]


def _features(key: str) -> tuple[str, ...]:
    """What an entry is fit on: a memory-bound class pooled over its ops by bytes alone (one op's
    per-row cost, a Softmax's, must not price every op it has no entry for), weights never
    (its constants are scales and zero points); a memory op's own entry by its rows too.

    >>> _features("memory"), _features("memory:Softmax"), _features("conv.i8")[-3:]
    (('call', 'moved'), ('call', 'moved', 'rows'), ('fused', 'rows', 'streamed'))
    """
    family = key.partition(".")[0].partition(":")[0]
    if family == "rnn":  # its weights are its MACs; its steps its rows
        return ("call", "mac", "rows")
    if family not in ("memory", "qmemory", "qdq", "control"):
        return FEATURES
    return ("call", "moved", "rows") if ":" in key else ("call", "moved")


def measure(threads: int | None = None, progress: Callable[[int], None] | None = None,
            name: str | None = None, batch: int = 1) -> Profile:
    """This machine's profile at `batch` (module docstring); `progress(1)` after each
    micro-model of each of ROUNDS passes."""
    flags = cpu_flags()
    default_name, isa = isa_name(flags)
    run_us = run_overhead(threads)
    calls: dict[str, list[tuple[Kernel, float]]] = {}
    for timed in _timed_suite(threads, progress, batch):
        for k, us in timed:
            for key in (f"{k.cls}:{k.op}", k.cls):
                calls.setdefault(key, []).append((k, us))
    for key in [key for key in calls if ":" in key]:  # a class of one op, or an op seen a few
        if {k.op for k, _ in calls[key.partition(":")[0]]} == {key.partition(":")[2]} or len(calls[key]) < MIN_CALLS:
            del calls[key]  # times: priced by its class's entry
    kernels = {key: fitted(key, [k for k, _ in found], [us for _, us in found]) for key, found in sorted(calls.items())}
    return Profile(
        name=name or default_name, kind="measured", cpu_flags=isa, onnxruntime=ort.__version__,
        threads=threads, batch=batch, run_us=run_us, kernels=kernels,
        description=f"measured by `qcli target measure` on {platform.machine()} ({os.cpu_count()} CPUs)",
        basis=f"{suite_size()} micro-models, each kernel's median time over {MIN_RUNS}-{RUNS} runs under "
              f"onnxruntime's profiler, the median of {ROUNDS} passes",
    )


def _timed_suite(threads: int | None, progress: Callable[[int], None] | None, batch: int = 1,
                 ) -> list[list[tuple[Kernel, float]]]:
    """Each micro-model's kernel calls and their times: the median over ROUNDS passes over the
    suite, each in a new session (one session's times can sit 40% off another's: a median of
    200 runs does not remove that)."""
    timed: list[list[tuple[Kernel, list[float]]]] = []
    for round_ in range(ROUNDS):
        for i, (_, model, feeds) in enumerate(bench.suite(np.random.default_rng(0))):
            known = [k for k, _ in timed[i]] if round_ else None  # the graph onnxruntime runs, read once
            found = timed_kernels(*bench.batched(model, feeds, batch), threads, known)
            if not round_:
                timed.append([(k, [us]) for k, us in found])
            else:
                for (k, kept), (again, us) in zip(timed[i], found, strict=False):
                    if again.node == k.node:
                        kept.append(us)
            if progress is not None:
                progress(1)
    return [[(k, float(np.median(times))) for k, times in model] for model in timed]


def suite_size() -> int:
    return sum(1 for _ in bench.suite(np.random.default_rng(0)))


def dump(profile: Profile) -> str:
    """The profile as the JSON file qcli reads (`format` first)."""
    doc = profile.model_dump(exclude_none=True, exclude_defaults=False)
    doc = {"format": FORMAT, **{k: v for k, v in doc.items() if k != "format"}}
    doc["kernels"] = {key: {k: v for k, v in cost.items() if v is not None and (k, v) != ("factor", 1.0)}
                      for key, cost in doc["kernels"].items()}
    return json.dumps(doc, indent=1) + "\n"
