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
from collections.abc import Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from itertools import islice
from typing import Any, Protocol

from service.search.task import FAILED, CandidateTask, plan_candidate, warm_up_worker

Work = Iterable[tuple[CandidateTask, dict[str, Any]]]
"""Tasks with the graph document each is planned from (shared, not copied, between tasks), handed over
as they are produced (a configuration's candidates as soon as it is captured)."""


class Executor(Protocol):
    name: str
    cores_per_task: int
    """The cores each task may use (its solver's threads)."""

    def run(self, work: Work) -> Iterator[dict[str, Any]]:
        """Each task's outcome, in the order they finish. Tasks are taken from ``work`` as workers free up
        (all running and one more queued), so what the runner decides as it hands one over (its solver
        limit under a budget) is decided with the outcomes so far."""
        ...

    def close(self) -> None: ...


class InlineExecutor:
    """Plans one candidate after the other in this process (one worker; the service's job processes)."""

    name = "inline"

    def __init__(self) -> None:
        self.cores_per_task = os.cpu_count() or 1

    def run(self, work: Work) -> Iterator[dict[str, Any]]:
        for task, graph in work:
            yield plan_candidate(task, graph)

    def close(self) -> None:
        pass


class LocalPoolExecutor:
    """A pool of ``workers`` processes on this machine (forked on Linux, spawned elsewhere)."""

    name = "local"

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.cores_per_task = max(1, (os.cpu_count() or 1) // workers)
        self.pool = self._start()

    def _start(self) -> ProcessPoolExecutor:
        method = "fork" if sys.platform.startswith("linux") else "spawn"
        pool = ProcessPoolExecutor(
            max_workers=self.workers,
            mp_context=multiprocessing.get_context(method),
            initializer=warm_up_worker,
        )
        pool.submit(int)  # start the workers now: they warm up while the first configuration is captured
        return pool

    def run(self, work: Work) -> Iterator[dict[str, Any]]:
        tasks = iter(work)
        pending: dict[Future, str] = {}
        while True:
            for task, graph in islice(tasks, self.workers + 1 - len(pending)):
                pending[self.pool.submit(plan_candidate, task, graph)] = task.candidate_id
            if not pending:
                return
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            broken = False
            for future in done:
                candidate_id = pending.pop(future)
                try:
                    yield future.result()
                except Exception as error:  # the worker process died (killed, out of memory)
                    broken = broken or isinstance(error, BrokenProcessPool)
                    yield lost(candidate_id, error)
            if broken:  # the tasks it still held fail with it (reported as they come); the rest: a new pool
                self.pool.shutdown(wait=False)
                self.pool = self._start()

    def close(self) -> None:
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

    def run(self, work: Work) -> Iterator[dict[str, Any]]:
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
            done, pending = ray.wait(pending, num_returns=1)
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
    return {
        "id": candidate_id,
        "status": FAILED,
        "plan": None,
        "min_peak_bytes": None,
        "error": f"worker lost: {type(error).__name__}: {first_line}",
        "seconds": 0.0,
    }


def make_executor(name: str, workers: int) -> Executor:
    """``ray`` (or any name when ``RAY_ADDRESS`` is set) on Ray; else a local pool, or this process for
    one worker."""
    if name == "ray" or os.environ.get("RAY_ADDRESS"):
        return RayExecutor()
    if workers <= 1:
        return InlineExecutor()
    return LocalPoolExecutor(workers)
