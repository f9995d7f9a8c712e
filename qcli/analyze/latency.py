"""Latency of the float and the quantized model, timed fairly against each other.

Both sessions come from `make_session` (CPU, same thread count, no idle spinning: a spinning
idle session steals the cores of the timed one, DESIGN.md §7) and get the same input. The runs
alternate in an A B B A pattern, so drifts (turbo clocks, a busy neighbour, cache warmth) hit both
models alike; the median and the 90th percentile are reported, and speedup = float median /
quantized median.

A verdict on a latency ratio (verification's floor) uses `Ratio`: the median of the per-round
ratios quantized / float (a round times both models back to back, so drift cancels within it)
with its distribution-free ~95% interval, the sign test's order statistics. A ratio whose
interval still reaches the ceiling is not measurably above it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import numpy as np

from qcli.analyze.report import Latency, Speed, rounded
from qcli.data import Batch, InputSpec

ORDER = "alternating, A B B A (float first on even rounds)"


class Ratio(float):
    """A latency ratio (quantized / float): the median of `rounds` per-round ratios, with the
    ~95% interval [low, high] of that median. A float, so it compares and prints like one.

    >>> r = Ratio([1.0, 1.1, 0.9] * 10)
    >>> float(r), r.low, r.high, r.count
    (1.0, 0.9, 1.1, 30)
    """

    low: float
    high: float
    rounds: tuple[float, ...]

    def __new__(cls, rounds: Iterable[float]) -> Ratio:
        ordered = tuple(sorted(float(r) for r in rounds))
        n = len(ordered)
        self = super().__new__(cls, float(np.median(ordered)) if n else float("inf"))
        k = max(int(np.floor(n / 2 - 0.98 * np.sqrt(n))), 0)  # P(k < rank of the median <= n - k) ~ 0.95
        self.rounds = ordered
        self.low, self.high = (ordered[k], ordered[n - 1 - k]) if n else (float("inf"), float("inf"))
        return self

    @property
    def count(self) -> int:
        return len(self.rounds)

    def pooled(self, other: Ratio) -> Ratio:
        """Both measurements' rounds as one."""
        return Ratio(self.rounds + other.rounds)

    def retimed(self, other: Ratio) -> Ratio:
        """A second timing with fresh sessions: the rounds pooled for the median, the interval
        spanning both timings' (rounds within a timing share their sessions, whose thread
        placement moves a ratio by more than the rounds' own spread: 0.85-1.05 for one model
        across processes). The ratio is measurably above a ceiling only when every timing is.

        >>> r = Ratio([1.0] * 20 + [1.2] * 20).retimed(Ratio([1.1] * 40))
        >>> float(r), r.low, r.high, r.count
        (1.1, 1.0, 1.2, 80)
        """
        both = self.pooled(other)
        both.low, both.high = min(self.low, other.low), max(self.high, other.high)
        return both

    def __reduce__(self):  # copy and pickle rebuild it from its rounds and interval
        return (_ratio, (self.rounds, self.low, self.high))


def _ratio(rounds: tuple[float, ...], low: float, high: float) -> Ratio:
    r = Ratio(rounds)
    r.low, r.high = low, high
    return r


def paired(speed: Speed) -> Ratio:
    """The per-round ratios of a `measure` (round i: quantized run i / float run i)."""
    return Ratio([q / f for f, q in zip(speed.float.runs_ms, speed.quantized.runs_ms, strict=True) if f > 0])


def timed_inputs(first: Batch, specs: list[InputSpec], batch: int) -> tuple[dict[str, np.ndarray], int]:
    """The first samples of the data, repeated along the batch axis to `batch` samples.

    Inputs with a fixed first dimension cannot be batched: they are used as they are and the
    batch is what they hold. Returns the feed and its batch size.
    """
    if not all(spec.batchable for spec in specs):  # the rows of its first input (one sample: `first.size`)
        return dict(first.inputs), next(iter(first.inputs.values())).shape[0]
    feeds = {}
    for name, array in first.inputs.items():
        reps = -(-batch // array.shape[0])
        feeds[name] = np.ascontiguousarray(np.concatenate([array] * reps)[:batch]) if reps > 1 else array[:batch]
    return feeds, batch


def _stats(times_ns: list[int], batch: int) -> Latency:
    ms = np.asarray(times_ns, dtype=np.float64) / 1e6
    median = float(np.median(ms))
    return Latency(
        median_ms=round(median, 4),
        p90_ms=round(float(np.percentile(ms, 90)), 4),
        mean_ms=round(float(ms.mean()), 4),
        min_ms=round(float(ms.min()), 4),
        max_ms=round(float(ms.max()), 4),
        throughput=rounded(batch / (median / 1e3)) if median > 0 else 0.0,
        runs_ms=[round(float(x), 4) for x in ms],
    )


def measure(
    run_float: Callable[[], object],
    run_quantized: Callable[[], object],
    *,
    runs: int,
    warmup: int,
    batch: int,
    threads: int | None,
) -> Speed:
    """Time `runs` calls of each (after `warmup` untimed calls of each), alternating."""
    if runs < 1:
        raise ValueError("runs must be at least 1")
    for _ in range(warmup):
        run_float()
        run_quantized()
    timed: tuple[list[int], list[int]] = ([], [])
    fns = (run_float, run_quantized)
    clock = time.perf_counter_ns
    for i in range(runs):
        order = (0, 1) if i % 2 == 0 else (1, 0)
        for which in order:
            start = clock()
            fns[which]()
            timed[which].append(clock() - start)
    f, q = _stats(timed[0], batch), _stats(timed[1], batch)
    speedup = float(np.median(timed[0])) / max(float(np.median(timed[1])), 1.0)
    return Speed(threads, batch, warmup, runs, ORDER, f, q, rounded(speedup, 4))
