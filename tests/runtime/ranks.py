"""Four spawned gloo ranks, started once per test module, that run `runtime.worker.run_rank` jobs.

Each job goes to every rank; the answer is each rank's report, or the error it raised as
``"ExceptionName: message"``. A rank that takes longer than `JOB_TIMEOUT_S` fails the test instead of
hanging it.
"""

from __future__ import annotations

import os
import queue
import socket
import traceback
from typing import Any

import torch.multiprocessing as mp

from runtime.worker import RunOptions

WORLD = 4
JOB_TIMEOUT_S = 300


class Ranks:
    def __init__(self) -> None:
        context = mp.get_context("spawn")
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

    def run(self, options: RunOptions) -> list[dict[str, Any] | str]:
        """Every rank's report (a dict) or error (a string), by rank."""
        for jobs in self.jobs:
            jobs.put(options)
        answers: dict[int, Any] = {}
        while len(answers) < WORLD:
            try:
                rank, answer = self.results.get(timeout=JOB_TIMEOUT_S)
            except queue.Empty as error:
                raise TimeoutError(
                    f"ranks {sorted(set(range(WORLD)) - set(answers))} did not answer"
                ) from error
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
    import torch.distributed as dist

    from runtime.worker import run_rank

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        while (options := jobs.get()) is not None:
            try:
                results.put((rank, run_rank(options)))
            except Exception as error:
                last = traceback.format_exc().strip().splitlines()[-1]
                results.put((rank, f"{type(error).__name__}: {error}" if str(error) else last))
    finally:
        dist.destroy_process_group()
