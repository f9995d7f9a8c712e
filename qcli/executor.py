"""Run one function over a list of items: in this process, in a pool of processes on this
machine, or on a Ray cluster. Results come back in item order whatever the number of workers,
so what a caller computes from them does not depend on where they ran.

    with make_executor("local", workers=2) as executor:
        results = executor.map(collect_shard, tasks)   # top-level function, picklable items

- `SerialExecutor` (one worker): calls the function in this process, one item after another.
- `LocalExecutor`: a `concurrent.futures.ProcessPoolExecutor` of `workers` processes started
  with "spawn" (a fresh interpreter: forking a process that holds onnxruntime's thread pools
  is not safe). Each item should use `threads` intra-op threads (cores // workers), so two
  workers on two cores do not oversubscribe them.
- `RayExecutor`: one Ray task per item on an existing cluster (`address`) or on a local
  instance started for the run and shut down after it; `pip install 'qcli[ray]'`.

Failures: an exception raised by the function (a bad sample's DataError) is raised again in
the caller as it was, and the other items are abandoned. A worker process that dies (killed
by the out-of-memory killer, a crash in native code) loses the items it was running: those
are run once more, one at a time, in fresh workers, and if one is lost again `WorkerLost`
names it. (Ray retries a task whose worker died once itself.)

Default (docs/guides/scale-out.md): `qcli calibrate` uses one worker, in its own process.
Measured on the 2-core machine with benchmarks/scale.py (the sample CNN, 512 samples): one
process 2.0 s, a local pool of two workers 3.1 s (0.65x), of one worker 2.6 s. The single
pass is already a three-thread pipeline with onnxruntime on both cores, and each worker
process pays about a second to start and import onnxruntime; more workers pay off with more
cores, longer passes, or a cluster.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import multiprocessing
import os
import socket
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from qcli.errors import QcliError, WorkerLost

T = TypeVar("T")
R = TypeVar("R")

Done = Callable[[int, Any], None]  # (item index, its result), called as each item finishes

EXECUTORS = ("local", "ray")
RAY_HINT = "install the extra: pip install 'qcli[ray]'"


class Executor(Protocol):
    """Maps a top-level function over picklable items; results in item order."""

    workers: int
    threads: int | None  # intra-op threads each item should use (None: onnxruntime's default)

    def map(self, fn: Callable[[T], R], items: Sequence[T], done: Done | None = None) -> list[R]: ...

    def close(self) -> None: ...


def cores() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def threads_per_worker(workers: int, available: int | None = None) -> int:
    """Intra-op threads for each of `workers` sharing `available` cores (at least 1).

    >>> threads_per_worker(2, 2), threads_per_worker(3, 8), threads_per_worker(4, 2)
    (1, 2, 1)
    """
    return max(1, (available or cores()) // workers)


class _Base:
    workers: int
    threads: int | None

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        pass


class SerialExecutor(_Base):
    """One worker: this process, items one after another (exceptions propagate as raised)."""

    def __init__(self) -> None:
        self.workers, self.threads = 1, None

    def map(self, fn: Callable[[T], R], items: Sequence[T], done: Done | None = None) -> list[R]:
        results = []
        for index, item in enumerate(items):
            results.append(fn(item))
            if done is not None:
                done(index, results[-1])
        return results


class LocalExecutor(_Base):
    """A pool of `workers` processes on this machine, started on first use, kept until `close`."""

    def __init__(self, workers: int | None = None):
        self.workers = workers or cores()
        self.threads = threads_per_worker(self.workers)
        self._pool: cf.ProcessPoolExecutor | None = None

    def map(self, fn: Callable[[T], R], items: Sequence[T], done: Done | None = None) -> list[R]:
        results: list[Any] = [None] * len(items)
        lost = self._run(fn, items, range(len(items)), results, done)
        # Items lost with a dead worker run again one at a time: less memory in use (the usual
        # killer), and a second death is then the fault of exactly the item that was running.
        for index in lost:
            if self._run(fn, items, [index], results, done):
                raise WorkerLost(index, len(items))
        return results

    def _run(self, fn: Callable, items: Sequence, indices, results: list, done: Done | None) -> list[int]:
        """Run `items[indices]` at once into `results`; return the indices lost with the pool."""
        try:
            futures = {self._start().submit(fn, items[i]): i for i in indices}
        except cf.process.BrokenProcessPool:  # a worker died while the pool sat idle
            self._terminate()
            futures = {self._start().submit(fn, items[i]): i for i in indices}
        lost = []
        try:
            for future in cf.as_completed(futures):
                index = futures[future]
                try:
                    results[index] = future.result()
                except cf.process.BrokenProcessPool:
                    lost.append(index)  # every item in flight is lost with the pool
                    continue
                if done is not None:
                    done(index, results[index])
        except BaseException:
            self._terminate()
            raise
        if lost:
            self._terminate()  # a broken pool takes no more work
        return sorted(lost)

    def _start(self) -> cf.ProcessPoolExecutor:
        if self._pool is None:
            self._pool = cf.ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"))
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def _terminate(self) -> None:
        """Stop the pool now: cancel queued items and kill the running workers."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        results = getattr(pool, "_result_queue", None)  # shutdown() drops it
        # Python 3.14 has terminate_workers(); before it the processes are only reachable
        # through the private `_processes` (without this, a failed run would wait for the
        # other workers to finish their items before it could report the error).
        terminate = getattr(pool, "terminate_workers", None)
        if terminate is not None:
            terminate()
        else:
            processes = list((getattr(pool, "_processes", None) or {}).values())
            pool.shutdown(wait=False, cancel_futures=True)
            for process in processes:
                if process.is_alive():
                    process.terminate()
            for process in processes:
                process.join()
        # A worker killed while it sent a result leaves half a message on the result pipe, and
        # the pool's manager thread waits in read() for the rest: for ever, because this
        # process holds the pipe's write end too (it never writes to it), and the interpreter
        # joins that thread at exit. Closing it lets the read end in EOF, a broken pool.
        if results is not None:
            results._writer.close()


class RayExecutor(_Base):
    """One Ray task per item, on the cluster at `address` or on a local instance started for
    the run (shut down by `close`). A Ray session that is already initialised is used as is."""

    def __init__(self, workers: int | None = None, address: str | None = None):
        ray = import_ray()
        self._ray = ray
        self._started = False
        if not ray.is_initialized():
            _check_reachable(address)
            try:
                ray.init(
                    address=address,
                    include_dashboard=False,
                    logging_level=logging.ERROR,
                    log_to_driver=False,  # workers' output would mix with qcli's (--json)
                    configure_logging=False,
                )
            except Exception as exc:  # ConnectionError, or ValueError for a bad address
                where = f"the Ray cluster at {address}" if address else "a local Ray instance"
                raise QcliError(
                    f"cannot start or reach {where}: {str(exc).strip()}",
                    hint="check --ray-address (host:port of the head node, or 'auto'), or "
                    "leave it out to start a local instance",
                ) from exc
            self._started = True
        total = max(1, int(ray.cluster_resources().get("CPU", 1)))
        largest = max((int(n["Resources"].get("CPU", 0)) for n in ray.nodes() if n.get("Alive")), default=total)
        self.workers = workers or total
        self.threads = max(1, min(largest, total // self.workers))

    def map(self, fn: Callable[[T], R], items: Sequence[T], done: Done | None = None) -> list[R]:
        ray = self._ray
        # max_retries: a task whose worker dies runs once more; an exception is not retried.
        task = ray.remote(_call).options(num_cpus=self.threads, max_retries=1, retry_exceptions=False)
        refs = [task.remote(fn, item) for item in items]
        index_of = {ref: i for i, ref in enumerate(refs)}
        results: list[Any] = [None] * len(items)
        remaining = list(refs)
        try:
            while remaining:
                ready, remaining = ray.wait(remaining, num_returns=1)
                index = index_of[ready[0]]
                try:
                    results[index] = ray.get(ready[0])
                except ray.exceptions.RayTaskError as exc:
                    cause = getattr(exc, "cause", None)
                    raise (cause if isinstance(cause, BaseException) else exc) from None
                except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError,
                        ray.exceptions.ObjectLostError) as exc:
                    raise WorkerLost(index, len(items), str(exc).strip().splitlines()[0]) from exc
                if done is not None:
                    done(index, results[index])
        except BaseException:
            for ref in remaining:
                ray.cancel(ref, force=True)
            raise
        return results

    def close(self) -> None:
        if self._started:
            self._ray.shutdown()
            self._started = False


def _check_reachable(address: str | None, timeout: float = 5.0) -> None:
    """Fail fast on a `host:port` nobody listens on: Ray itself retries for minutes."""
    if not address or address == "auto" or "://" in address or ":" not in address:
        return
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except (OSError, ValueError) as exc:
        raise QcliError(
            f"cannot reach the Ray cluster at {address}: {exc}",
            hint="give the head node's host:port (ray start --head prints it), or leave out "
            "--ray-address to start a local instance",
        ) from None


def _call(fn: Callable[[T], R], item: T) -> R:
    return fn(item)


def import_ray():
    """The `ray` module, or a QcliError (exit 2) saying how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise QcliError(f"--executor ray needs Ray, which is not installed ({exc})", hint=RAY_HINT) from None
    return ray


MAX_LOCAL_WORKERS = 256  # each local worker is a process holding its own model and session


def make_executor(kind: str = "local", workers: int | None = None, address: str | None = None) -> Executor:
    """The executor `--executor KIND --workers N [--ray-address ADDR]` asks for.

    `local` with one worker runs in this process (`SerialExecutor`); `workers=None` means one
    per core here (local) or per CPU of the cluster (ray).
    """
    if kind not in EXECUTORS:
        raise QcliError(f"unknown executor {kind!r}", hint=f"use one of: {', '.join(EXECUTORS)}")
    if workers is not None and workers < 1:
        raise QcliError(f"--workers must be at least 1, got {workers}")
    if kind == "local" and workers is not None and workers > MAX_LOCAL_WORKERS:
        raise QcliError(f"--workers {workers} is more processes than one machine runs usefully "
                        f"(at most {MAX_LOCAL_WORKERS}; this one has {cores()} cores)",
                        hint="use about one worker per core, or --executor ray for a cluster")
    if address is not None and kind != "ray":
        raise QcliError("--ray-address needs --executor ray")
    if kind == "ray":
        return RayExecutor(workers, address)
    if (workers or cores()) == 1:
        return SerialExecutor()
    return LocalExecutor(workers)
