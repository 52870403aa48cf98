"""The worker process: runs one job at a time for its replica, sends progress and the result back.

Messages to the worker: ``("run", kind, request)`` (a search's request: ``{"search": body, "out": folder,
"cache_url": the service's database}``). From it: ``("ready",)`` once the solver is loaded,
``("progress", record)``, ``("done", document, seconds)`` or ``("failed", {"type", "message"})``.
A worker whose parent died exits by itself (a replica killed mid-job leaves no orphan solving on).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

PARENT_CHECK_S = 0.5
PROGRESS_EVERY_S = 0.25
PHASE_CHANGE_EVERY_S = 0.02


def worker_main(connection: Connection) -> None:
    """The worker's loop (the target of its process). Ctrl-C is its replica's to handle."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _exit_with_parent(os.getppid())
    from service import planning

    _warm_up(planning)
    connection.send(("ready",))
    while True:
        try:
            message = connection.recv()
        except EOFError:
            return
        _, kind, request = message
        progress = _ProgressSender(connection)
        answer = _run(planning, kind, request, progress)
        progress.flush()
        connection.send(answer)


def _warm_up(planning: Any) -> None:
    """Plan a tiny model once before saying ready: the first plan of a process pays ~3 s of imports and
    first-call costs (a small plan after it takes ~0.1 s), and a worker that can plan is one that is ready."""
    from service.app.schemas import PlanSubmission

    tiny = PlanSubmission.model_validate(
        {"model": "mlp", "options": {"d": 8, "h": 8}, "batch": 2, "mesh": {"shape": [2]}}
    )
    planning.run_plan_job(planning.canonical_plan_request(tiny))


def _run(planning: Any, kind: str, request: dict[str, Any], report: Any) -> tuple:
    from solver.errors import InfeasibleError

    started = time.perf_counter()
    try:
        if kind == "search":
            from service.search.job import run_search_job

            document = run_search_job(request["search"], Path(request["out"]), request["cache_url"], report)
        else:
            run = planning.run_plan_job if kind == "plan" else planning.run_solve_job
            document = run(request, report)
    except planning.BadRequest as error:
        return ("failed", {"type": "bad_request", "message": str(error)})
    except InfeasibleError as error:
        return ("failed", {"type": "infeasible", "message": str(error)})
    except Exception as error:  # the job fails, the worker lives on
        first_line = (str(error).splitlines() or [""])[0]
        return ("failed", {"type": "error", "message": f"{type(error).__name__}: {first_line}"})
    return ("done", document, time.perf_counter() - started)


class _ProgressSender:
    """Sends progress at most once per PROGRESS_EVERY_S, or per PHASE_CHANGE_EVERY_S when the phase
    changed (a solver switching phases fast does not flood the pipe); :meth:`flush` sends the latest
    record held back, so a finished job's progress is its last."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.sent_at = 0.0
        self.phase: str | None = None
        self.held: dict[str, Any] | None = None

    def __call__(self, record: dict[str, Any]) -> None:
        now = time.monotonic()
        every = PHASE_CHANGE_EVERY_S if record["phase"] != self.phase else PROGRESS_EVERY_S
        if now - self.sent_at < every:
            self.held = record
            return
        self.sent_at, self.phase, self.held = now, record["phase"], None
        self.connection.send(("progress", record))

    def flush(self) -> None:
        if self.held is not None:
            self.connection.send(("progress", self.held))
            self.held = None


def _exit_with_parent(parent: int) -> None:
    def watch() -> None:
        while True:
            if os.getppid() != parent:
                os._exit(1)
            time.sleep(PARENT_CHECK_S)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
