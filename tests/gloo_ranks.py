"""Four ranks of one gloo group on 127.0.0.1, running jobs sent to them.

One group serves the whole session (the `ranks` fixture of `tests/conftest.py`): starting one costs ~7 s and
stopping it ~2.5 s, and the runtime and conformance modules would pay that ten times. A group whose rank died
or whose job timed out is replaced before the next module uses it, so one module's crash stays its own.

The ranks are forked from multiprocessing's fork server (`PRELOAD` imported there once). A job is a
module-level function and its arguments (both pickled); every rank runs it and answers its result,
or :class:`RankError` with the exception's last line and traceback. The ranks join the group, set one thread
each (two cores, four ranks) and register autoshard's rules with DTensor before saying they are ready. A job
that takes longer than `JOB_TIMEOUT_S`, or whose rank dies, fails the caller instead of hanging it.

Jobs take their device meshes from `runtime.worker.device_mesh`, one per layout per rank: each mesh axis is a
gloo group with threads that wake while idle, and a mesh made per job left ~100 in every rank by the end of
the runtime tests, slowing every test after.
"""

from __future__ import annotations

import os
import queue
import socket
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.multiprocessing as mp

WORLD = 4
START_TIMEOUT_S = 120
JOB_TIMEOUT_S = 300


@dataclass(frozen=True)
class RankError:
    """What a rank raised: ``"ExceptionName: message"`` and the traceback."""

    message: str
    traceback: str


#: What the ranks' fork server imports once: each rank (and each group replacing a broken one) is then a fork
#: of it, not an interpreter importing torch, DTensor and the runtime again (~4 s of CPU per rank on 2 cores).
PRELOAD = (
    "tests.gloo_ranks",
    "torch.distributed",
    "runtime.worker",
    "runtime.planned_step",
    "strategies.ops.dtensor_bridge",
    "strategies.plan.planner",
)


class GlooRanks:
    def __init__(self) -> None:
        context = mp.get_context("forkserver")
        context.set_forkserver_preload(list(PRELOAD))
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.jobs = [context.Queue() for _ in range(WORLD)]
        self.results = context.Queue()
        self.processes = [
            context.Process(target=_serve, args=(rank, port, self.jobs[rank], self.results), daemon=True)
            for rank in range(WORLD)
        ]
        for process in self.processes:
            process.start()
        for _ in range(WORLD):
            rank, answer = self.results.get(timeout=START_TIMEOUT_S)
            if isinstance(answer, RankError):
                raise RuntimeError(f"rank {rank} failed to start: {answer.message}")
        self.broken = False

    @property
    def healthy(self) -> bool:
        """Every rank alive and no answer owed (after a timeout, a late answer would answer the next job)."""
        return not self.broken and all(process.is_alive() for process in self.processes)

    def run(self, function: Callable[..., Any], *args: Any) -> list[Any]:
        """``function(*args)`` on every rank: each rank's result or :class:`RankError`, by rank."""
        for jobs in self.jobs:
            jobs.put((function, args))
        answers: dict[int, Any] = {}
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while len(answers) < WORLD:
            try:
                rank, answer = self.results.get(timeout=1.0)
            except queue.Empty:
                silent = sorted(set(range(WORLD)) - set(answers))
                dead = [rank for rank in silent if not self.processes[rank].is_alive()]
                if dead or time.monotonic() > deadline:
                    self.broken = True
                    if dead:
                        codes = [self.processes[rank].exitcode for rank in dead]
                        raise RuntimeError(f"ranks {dead} died (exit codes {codes})") from None
                    raise TimeoutError(f"ranks {silent} did not answer in {JOB_TIMEOUT_S} s") from None
                continue
            answers[rank] = answer
        return [answers[rank] for rank in range(WORLD)]

    def close(self) -> None:
        for jobs in self.jobs:
            jobs.put(None)
        for process in self.processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()


def _serve(rank: int, port: int, jobs: Any, results: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    import torch.distributed as dist

    try:
        dist.init_process_group("gloo", rank=rank, world_size=WORLD)
        from strategies.ops.dtensor_bridge import register_with_dtensor

        register_with_dtensor()
    except Exception as error:
        results.put((rank, _error(error)))
        return
    results.put((rank, "ready"))
    try:
        while (job := jobs.get()) is not None:
            function, args = job
            try:
                results.put((rank, function(*args)))
            except Exception as error:
                results.put((rank, _error(error)))
    finally:
        dist.destroy_process_group()


def _error(error: Exception) -> RankError:
    text = (
        f"{type(error).__name__}: {error}" if str(error) else traceback.format_exc().strip().splitlines()[-1]
    )
    return RankError(text, traceback.format_exc())
