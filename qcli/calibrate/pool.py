"""Many tensors' ranges solved on two processes (`solve_many`).

The histogram searches (mse above all: 2-3 ms a tensor, and a k-fold run solves five tables)
are numpy calls on small arrays that hold the GIL between them: two threads ran them slower
than one (the PaddleOCR recognizer's five tables 3.2 -> 4.2 s). So a helper process started
with "spawn" (a fresh interpreter: this one may hold onnxruntime's threads; it imports numpy
and the solvers in ~0.2 s) takes every other job while this process solves the rest. Below
MIN_JOBS searches its start outweighs its half, and everything runs here, as it does inside a
daemon process (a pool's worker may not start one) and when the helper cannot start or dies.
The ranges are the same wherever they were solved (the same code on the same machine), in the
jobs' order.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
from collections.abc import Sequence
from typing import TYPE_CHECKING

from qcli.calibrate.observers import TensorObserver
from qcli.calibrate.ranges import Range
from qcli.calibrate.solvers import solve_range
from qcli.scheme import quant_dtype

if TYPE_CHECKING:
    from qcli.calibrate.table import RangeSettings

Job = tuple[TensorObserver, "RangeSettings", str]  # the statistics, the target, the method

#: Searches (jobs of a method other than minmax, which reads two numbers) below which one
#: process solves them all: the helper's start and the pickling cost ~0.3 s, a search ~2.5 ms.
MIN_JOBS = 240


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


def solve_many(jobs: Sequence[Job], min_jobs: int = MIN_JOBS) -> list[Range]:
    """Each job's range, in order: half of them in a helper process when at least `min_jobs`
    are searches (module docstring)."""
    searches = sum(method != "minmax" for _, _, method in jobs)
    if searches < min_jobs or multiprocessing.current_process().daemon:
        return _solve_all(jobs)
    theirs = list(jobs[1::2])
    try:
        pool = cf.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
        future = pool.submit(_solve_all, theirs)
    except OSError:  # no process to be had: all here
        return _solve_all(jobs)
    with pool:
        mine = _solve_all(jobs[0::2])
        try:
            other = future.result()
        except (cf.process.BrokenProcessPool, OSError):
            other = _solve_all(theirs)
    out: list[Range] = [(0.0, 0.0)] * len(jobs)
    out[0::2], out[1::2] = mine, other
    return out
