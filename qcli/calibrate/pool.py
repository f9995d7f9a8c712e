"""Many tensors' ranges solved on two processes (`solve_many`).

The histogram searches (mse above all: 2-3 ms a tensor, and a k-fold run solves five tables)
are numpy calls on small arrays that hold the GIL between them: two threads ran them slower
than one (the PaddleOCR recognizer's five tables 3.2 -> 4.2 s). So a helper process takes
every other job while this process solves the rest: `python -m qcli.calibrate.pool`, fed the
jobs pickled on its stdin, answering on its stdout (a fresh interpreter that imports numpy and
the solvers in ~0.2 s; not multiprocessing's "spawn", which imports the caller's main script
again: a script without a `__main__` guard would run its work twice). Below MIN_JOBS searches
its start outweighs its half, and everything runs here, as it does when the helper cannot
start or fails. A caller that knows the searches to come before it has their statistics (the
calibration pass: its tensors, methods and folds) starts the helper ahead (`started`), from
READY_JOBS searches: it imports while the pass runs. The ranges are the same wherever they
were solved (the same code on the same machine), in the jobs' order.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from qcli.calibrate.observers import TensorObserver
from qcli.calibrate.ranges import Range, RangeSettings
from qcli.calibrate.solvers import solve_range
from qcli.scheme import quant_dtype

Job = tuple[TensorObserver, RangeSettings, str]  # the statistics, the target, the method

#: Searches (jobs of a method other than minmax, which reads two numbers) below which one
#: process solves them all: the helper costs ~0.23 s (start, imports, pickling), a search ~2.5 ms.
MIN_JOBS = 240
#: The same for a helper `started` ahead of its searches: its start-up is hidden, and what it
#: still costs (its CPU time beside the pass, the pickling) is that of ~90 searches at most.
READY_JOBS = 96


def solve(observer: TensorObserver, settings: RangeSettings, method: str) -> Range:
    """One tensor's range by `method` for `settings`' target ([0, 0] without finite values)."""
    if observer.count == 0:  # only NaN/Inf (or nothing) seen: a range that quantizes to 0
        return (0.0, 0.0)
    lo, hi = solve_range(
        method, observer, quant_dtype(settings.dtype), settings.symmetric, **settings.params(method)
    )
    return (float(lo), float(hi))


def _solve_all(jobs: Sequence[Job]) -> list[Range]:
    return [solve(*job) for job in jobs]


def solve_many(jobs: Sequence[Job], min_jobs: int = MIN_JOBS, helper: subprocess.Popen | None = None) -> list[Range]:
    """Each job's range, in order: half of them in a helper process when at least `min_jobs`
    are searches, or in `helper` (`started` ahead of them) when it is given (module docstring)."""
    if helper is None and sum(method != "minmax" for _, _, method in jobs) >= min_jobs:
        helper = _spawn()
    if helper is None or len(jobs) < 2:  # a helper started ahead and left unused is ended by `started`
        return _solve_all(jobs)
    theirs = list(jobs[1::2])
    _feed(helper, theirs)
    mine = _solve_all(jobs[0::2])
    other = _answer(helper, len(theirs))
    if other is None:
        other = _solve_all(theirs)
    out: list[Range] = [(0.0, 0.0)] * len(jobs)
    out[0::2], out[1::2] = mine, other
    return out


@contextmanager
def started(searches: int) -> Iterator[subprocess.Popen | None]:
    """A helper started now for `searches` searches to come (None below READY_JOBS), so that
    its start-up overlaps the work before them (the calibration pass); ended on the way out
    when it was not used."""
    helper = _spawn() if searches >= READY_JOBS else None
    try:
        yield helper
    finally:
        if helper is not None and helper.poll() is None:
            helper.kill()
            helper.wait()
        for pipe in (helper.stdin, helper.stdout) if helper is not None else ():
            if pipe is not None and not pipe.closed:
                pipe.close()


def _spawn() -> subprocess.Popen | None:
    """The helper process, waiting for its jobs on stdin; None when it cannot start."""
    root = str(Path(__file__).resolve().parents[2])  # where `qcli` is, installed or not
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    try:
        return subprocess.Popen([sys.executable, "-m", "qcli.calibrate.pool"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    except OSError:
        return None


def _feed(helper: subprocess.Popen | None, jobs: list[Job]) -> subprocess.Popen | None:
    """`helper` given `jobs` (on a thread: the pipe holds less than they take)."""
    if helper is None:
        return None
    data = pickle.dumps(jobs, protocol=pickle.HIGHEST_PROTOCOL)

    def feed() -> None:
        assert helper.stdin is not None
        try:
            helper.stdin.write(data)
            helper.stdin.close()
        except OSError:  # it died: `_answer` finds out
            pass

    threading.Thread(target=feed, daemon=True).start()
    return helper


def _answer(helper: subprocess.Popen | None, count: int) -> list[Range] | None:
    """The helper's ranges, or None when it failed (its jobs are then solved here)."""
    if helper is None:
        return None
    assert helper.stdout is not None
    try:
        data = helper.stdout.read()
        ok = helper.wait() == 0
        ranges = pickle.loads(data) if ok else None
    except (OSError, pickle.UnpicklingError, EOFError):
        helper.kill()
        return None
    return ranges if isinstance(ranges, list) and len(ranges) == count else None


if __name__ == "__main__":  # the helper: jobs on stdin, their ranges on stdout
    sys.stdout.buffer.write(pickle.dumps(_solve_all(pickle.loads(sys.stdin.buffer.read())),
                                         protocol=pickle.HIGHEST_PROTOCOL))
