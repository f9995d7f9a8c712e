"""Where a run's wall time and memory go: seconds, call counts and peak RSS per phase.

`recording()` starts a record for the code it wraps; `phase(name)` anywhere below adds its
wall time to the record, nested phases under their parent's path (`verify/search/build`), so
the library needs no profiler threaded through its signatures. Without a record `phase` costs
a context-variable lookup. `qcli quantize --json` reports the record as "phases" (and the
summary prints the top level); benchmarks/exported.py prints it per exported model. A phase's
`peak_mb` is the process's peak RSS (`peak_mb()`) when it last ended: the peak is
reached in the first phase, in the order they ran, whose figure equals the run's. Timings and
memory are the one part of the output that differs between identical runs.

`ProgressFactory` is how a long phase reports progress to whoever shows it (the CLI's bar;
`no_progress` for library callers).
"""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass, field


@dataclass
class Phases:
    seconds: dict[str, float] = field(default_factory=dict)  # path -> wall seconds, summed over calls
    counts: dict[str, int] = field(default_factory=dict)  # path -> calls
    peaks: dict[str, float] = field(default_factory=dict)  # path -> peak RSS (MB) when it last ended
    path: tuple[str, ...] = ()  # the phases open now

    def add(self, path: str, seconds: float) -> None:
        self.seconds[path] = self.seconds.get(path, 0.0) + seconds
        self.counts[path] = self.counts.get(path, 0) + 1
        self.peaks[path] = peak_mb()

    def to_dict(self) -> dict[str, dict[str, float | int]]:
        """{path: {"seconds", "calls", "peak_mb"}} in the order the phases first began (JSON)."""
        return {p: {"seconds": round(s, 4), "calls": self.counts[p], "peak_mb": round(self.peaks.get(p, 0.0), 1)}
                for p, s in self.seconds.items()}


def peak_phase(phases: dict[str, dict]) -> tuple[str, float] | None:
    """(the first phase, in the order they ran, whose `peak_mb` is the run's, that peak) of a
    `Phases.to_dict()` record, or of part of one; None without figures.

    >>> peak_phase({"calibrate": {"peak_mb": 300.0}, "verify": {"peak_mb": 512.4},
    ...             "verify/time": {"peak_mb": 512.4}, "write": {"peak_mb": 512.4}})
    ('verify', 512.4)
    """
    peaks = {p: v["peak_mb"] for p, v in phases.items() if v.get("peak_mb")}
    if not peaks:
        return None
    top = max(peaks.values())
    return next(p for p, mb in peaks.items() if mb == top), top


def peak_mb() -> float:
    """This process's peak resident set size so far, in MB: Linux's VmHWM, which starts again at
    exec (ru_maxrss keeps the peak of the process that forked it: a big parent's, measured
    from a benchmark or a test), else ru_maxrss (bytes on macOS)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1 << 20) if sys.platform == "darwin" else peak / 1024


_record: ContextVar[Phases | None] = ContextVar("qcli_phases", default=None)


@contextmanager
def recording() -> Iterator[Phases]:
    """A fresh record for everything timed inside the block."""
    phases = Phases()
    token = _record.set(phases)
    try:
        yield phases
    finally:
        _record.reset(token)


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Add the block's wall time to `name` under the phases open now (nothing without a record).

    >>> with recording() as r:
    ...     with phase("verify"):
    ...         with phase("build"):
    ...             pass
    >>> list(r.counts)
    ['verify', 'verify/build']
    """
    phases = _record.get()
    if phases is None:
        yield
        return
    outer = phases.path
    phases.path = (*outer, name)
    path = "/".join(phases.path)
    phases.seconds.setdefault(path, 0.0)  # parents listed before their children
    phases.counts.setdefault(path, 0)
    start = time.perf_counter()
    try:
        yield
    finally:
        phases.add(path, time.perf_counter() - start)
        phases.path = outer


# progress(description, total, unit="samples") -> a context manager giving an `advance(n)`
# callback (total None: unknown)
ProgressFactory = Callable[..., AbstractContextManager[Callable[[int], None]]]


def no_progress(description: str, total: int | None, unit: str = "samples"):
    return nullcontext(lambda n: None)
