"""The worker process: runs one job at a time for its replica, sends progress and the result back.

Messages to the worker: ``("run", kind, request, context)``: the request's JSON text, parsed here (a
multi-MiB graph costs the replica's API process no parsing or pickling), and for a search ``{"out": folder,
"cache_url": the service's database, "owner": the job's principal}``. From it: ``("ready",)`` once the
solver is loaded, ``("progress", record)``, ``("done", document as JSON text, seconds)`` or ``("failed",
{"type", "message"})``.
A worker whose server died exits by itself (a replica killed mid-job leaves no orphan solving on). An
unexpected error's message is reported without server paths or native backtraces.
"""

from __future__ import annotations

import json
import signal
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

PROGRESS_EVERY_S = 0.25
PHASE_CHANGE_EVERY_S = 0.02


def worker_main(connection: Connection, server: int) -> None:
    """The worker's loop (the target of its process). Ctrl-C is its replica's to handle."""
    from service.processes import exit_with_server

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    exit_with_server(server)
    from service import planning

    _warm_up(planning)
    connection.send(("ready",))
    while True:
        try:
            message = connection.recv()
        except EOFError:
            return
        _, kind, request, context = message
        progress = _ProgressSender(connection)
        answer = _run(planning, kind, request, context, progress)
        progress.flush()
        connection.send(answer)


def _warm_up(planning: Any) -> None:
    """Plan a tiny model once before saying ready: the first plan of a process pays ~3 s of imports and
    first-call costs (a small plan after it takes ~0.1 s), and a worker that can plan is one that is ready."""
    from service.submissions import PlanSubmission, canonical_plan_request

    tiny = PlanSubmission.model_validate(
        {"model": "mlp", "options": {"d": 8, "h": 8}, "batch": 2, "mesh": {"shape": [2]}}
    )
    planning.run_plan_job(canonical_plan_request(tiny))


def _run(planning: Any, kind: str, text: str, context: dict[str, Any] | None, report: Any) -> tuple:
    from solver.errors import InfeasibleError

    started = time.perf_counter()
    try:
        request = json.loads(text)
        if kind == "search":
            from service.search.job import run_search_job

            assert context is not None
            out, cache_url, owner = Path(context["out"]), context["cache_url"], context["owner"]
            document = run_search_job(request, out, cache_url, report, owner)
        else:
            run = planning.run_plan_job if kind == "plan" else planning.run_solve_job
            document = run(request, report)
        answer = json.dumps(document)
    except planning.BadRequest as error:
        return ("failed", {"type": "bad_request", "message": str(error)})
    except InfeasibleError as error:
        return ("failed", {"type": "infeasible", "message": str(error)})
    except Exception as error:  # the job fails, the worker lives on
        return ("failed", {"type": "error", "message": planning.public_message(error)})
    return ("done", answer, time.perf_counter() - started)


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
