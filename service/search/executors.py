"""Where candidates are planned: in this process, in a local process pool, or on a Ray cluster.

Every executor takes the same tasks (a candidate and the graph document of its model configuration) and
yields the same outcomes (:func:`service.search.task.plan_candidate`) as they finish, so a search gives the
same results on each. The local pool forks its workers from the searching process on Linux: they start with
the planner already imported (no second ~3 s import per worker). On Ray each graph document is put in the
object store once and shared by reference by every task of its configuration.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from itertools import islice
from typing import Any, Protocol

from service.search.task import FAILED, SKIPPED, CandidateTask, plan_candidate, warm_up_worker

Work = Iterable[tuple[CandidateTask, dict[str, Any]]]
"""Tasks with the graph document each is planned from (shared, not copied, between tasks), handed over
as they are produced (a configuration's candidates as soon as it is captured)."""


class Executor(Protocol):
    name: str
    cores_per_task: int
    """The cores each task may use (its solver's threads)."""

    def run(self, work: Work, deadline: float | None = None) -> Iterator[dict[str, Any]]:
        """Each task's outcome, in the order they finish. Tasks are taken from ``work`` as workers free up
        (all running and one more queued), so what the runner decides as it hands one over (its solver
        limit under a budget) is decided with the outcomes so far. At ``deadline`` (a ``time.perf_counter()``
        reading) the tasks still running are stopped, each a `stopped` outcome: a budget bounds the search's
        wall time, not only its starts."""
        ...

    def close(self) -> None: ...


class InlineExecutor:
    """Plans one candidate after the other in this process (one worker; the service's job processes)."""

    name = "inline"

    def __init__(self) -> None:
        self.cores_per_task = os.cpu_count() or 1

    def run(self, work: Work, deadline: float | None = None) -> Iterator[dict[str, Any]]:
        """(A task in this process cannot be stopped: ``deadline`` only decides starts, in the runner.)"""
        for task, graph in work:
            yield plan_candidate(task, graph)

    def close(self) -> None:
        pass


class LocalPoolExecutor:
    """A pool of ``workers`` processes on this machine (forked on Linux, spawned elsewhere)."""

    name = "local"

    def __init__(self, workers: int, plan: Callable[..., dict[str, Any]] = plan_candidate) -> None:
        self.workers = workers
        self.cores_per_task = max(1, (os.cpu_count() or 1) // workers)
        self.plan = plan
        """What a worker runs per task (a module-level function: it is sent by name)."""
        self.pool: ProcessPoolExecutor | None = self._start()

    def _start(self) -> ProcessPoolExecutor:
        method = "fork" if sys.platform.startswith("linux") else "spawn"
        pool = ProcessPoolExecutor(
            max_workers=self.workers,
            mp_context=multiprocessing.get_context(method),
            initializer=warm_up_worker,
        )
        pool.submit(int)  # start the workers now: they warm up while the first configuration is captured
        return pool

    def run(self, work: Work, deadline: float | None = None) -> Iterator[dict[str, Any]]:
        tasks = iter(work)
        pending: dict[Future, tuple[str, float]] = {}
        while True:
            for task, graph in islice(tasks, self.workers + 1 - len(pending)):
                self.pool = self.pool or self._start()
                future = self.pool.submit(self.plan, task, graph)
                pending[future] = (task.candidate_id, time.perf_counter())
            if not pending:
                return
            timeout = None if deadline is None else max(0.0, deadline - time.perf_counter())
            done, _ = wait(pending, timeout=timeout, return_when=FIRST_COMPLETED)
            if not done:  # the deadline: what still runs is stopped, its workers with it
                for candidate_id, handed in pending.values():
                    yield stopped(candidate_id, time.perf_counter() - handed)
                pending.clear()
                self._stop_workers()
                continue
            broken = False
            for future in done:
                candidate_id, _ = pending.pop(future)
                try:
                    yield future.result()
                except Exception as error:  # the worker process died (killed, out of memory)
                    broken = broken or isinstance(error, BrokenProcessPool)
                    yield lost(candidate_id, error)
            if broken and self.pool is not None:  # the tasks it still held fail with it (reported as they
                self.pool.shutdown(wait=False)  # come); the rest go to a new pool
                self.pool = self._start()

    def _stop_workers(self) -> None:
        """End the pool now, its running tasks with it (a new one starts if more tasks come)."""
        if self.pool is None:
            return
        # ProcessPoolExecutor stops no running task (3.14's terminate_workers is not in 3.11): its processes
        processes = list(getattr(self.pool, "_processes", {}).values())
        for process in processes:
            process.terminate()
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.pool = None

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)


class RayExecutor:
    """Tasks on a Ray cluster (``RAY_ADDRESS``, or a local instance started here), one CPU each."""

    name = "ray"

    def __init__(self, address: str | None = None) -> None:
        import ray

        self.ray = ray
        self.started_here = not ray.is_initialized()
        if self.started_here:
            address = address or os.environ.get("RAY_ADDRESS")
            ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
        self.cores_per_task = 1
        self.remote = ray.remote(num_cpus=self.cores_per_task, max_retries=0)(plan_candidate)

    def run(self, work: Work, deadline: float | None = None) -> Iterator[dict[str, Any]]:
        ray = self.ray
        tasks = iter(work)
        slots = max(1, int(ray.cluster_resources().get("CPU", 1)) // self.cores_per_task) + 1
        shared: dict[int, Any] = {}
        pending: list[Any] = []
        ids: dict[Any, str] = {}
        while True:
            for task, graph in islice(tasks, slots - len(pending)):
                ref = shared.get(id(graph))
                if ref is None:
                    ref = shared[id(graph)] = ray.put(graph)
                answer = self.remote.remote(task, ref)
                pending.append(answer)
                ids[answer] = task.candidate_id
            if not pending:
                return
            timeout = None if deadline is None else max(0.0, deadline - time.perf_counter())
            done, pending = ray.wait(pending, num_returns=1, timeout=timeout)
            if not done:  # the deadline: what still runs is cancelled
                for answer in pending:
                    ray.cancel(answer, force=True)
                    yield stopped(ids[answer], None)
                pending = []
                continue
            try:
                yield from ray.get(done)
            except Exception as error:  # the task's worker died
                yield lost(ids[done[0]], error)

    def close(self) -> None:
        if self.started_here:
            self.ray.shutdown()


def lost(candidate_id: str, error: BaseException) -> dict[str, Any]:
    """The outcome of a candidate whose worker died before answering: failed, with the reason."""
    first_line = (str(error).splitlines() or [""])[0]
    return _unanswered(candidate_id, FAILED, f"worker lost: {type(error).__name__}: {first_line}", 0.0)


def stopped(candidate_id: str, seconds: float | None) -> dict[str, Any]:
    """The outcome of a candidate still planning at the search's deadline: skipped, stopped there."""
    after = f" {seconds:.1f} s after it was handed over" if seconds is not None else ""
    error = f"not finished: stopped at the budget's end{after}"
    return _unanswered(candidate_id, SKIPPED, error, seconds or 0.0)


def _unanswered(candidate_id: str, status: str, error: str, seconds: float) -> dict[str, Any]:
    """The outcome of a candidate its worker gave no answer for (as `plan_candidate` shapes one)."""
    return {
        "id": candidate_id,
        "status": status,
        "plan": None,
        "min_peak_bytes": None,
        "error": error,
        "seconds": seconds,
    }


def make_executor(name: str, workers: int) -> Executor:
    """``ray`` (or any name when ``RAY_ADDRESS`` is set) on Ray; else a local pool, or this process for
    one worker."""
    if name == "ray" or os.environ.get("RAY_ADDRESS"):
        return RayExecutor()
    if workers <= 1:
        return InlineExecutor()
    return LocalPoolExecutor(workers)
