"""Submissions read and checked off the event loop, each within a CPU-time limit.

A small body is read (parsed, bounded, hashed) in the API process: microseconds, so a cached plan is answered
without leaving the event loop. A larger body is read by a checker process, and every full check (a built-in
model built on the meta device, a graph document read on fake tensors: up to seconds of CPU) runs there too,
so ``/healthz`` and cached reads stay fast while large documents are checked. A check that takes more than
``check_cpu_s`` CPU seconds is stopped (``SIGPROF`` from an ``ITIMER_PROF`` timer) and refused with 422; a
checker stuck or killed is replaced. With ``check_workers = 0`` checks run in a thread of the API process
instead, without the CPU limit (tests, development).
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable
from typing import Any

from starlette.concurrency import run_in_threadpool

from service.app.errors import too_busy
from service.intake import Intake, Limits, check, read_plan
from service.processes import PoolBusy, PoolFailed, ProcessPool, exit_with_server
from service.settings import Settings
from service.submissions import BadRequest

log = logging.getLogger("autoshard.checker")
WALL_TIMEOUT_FACTOR = 3.0
"""A check's wall-clock limit is this many times its CPU limit (plus a start-up allowance): past it the
checker is stuck (in native code the CPU timer cannot interrupt) or starved, and is replaced."""
START_ALLOWANCE_S = 60.0
# checkers run below the server (Unix niceness, 19 the lowest priority): checking is background work
CHECKER_NICENESS = 10
# a checker's first check, of a tiny built-in plan, made while it starts
WARM_UP_LIMITS = Limits(max_graph_bytes=0, max_time_limit_s=1e9, max_search_candidates=1, max_job_solver_s=1)


class CheckTimeout(BaseException):
    """Raised by the CPU timer's signal inside a checker process (a BaseException: no ``except Exception``
    in the code being checked may swallow it)."""


class Checker:
    """Reads and checks submissions for the routes; answers BadRequest (4xx) or a 429 when busy."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.limits = Limits(
            max_graph_bytes=settings.max_graph_bytes,
            max_time_limit_s=settings.max_time_limit_s,
            max_search_candidates=settings.max_search_candidates,
            max_job_solver_s=settings.max_job_solver_s,
        )
        self.pool = (
            ProcessPool("checker", settings.check_workers, settings.max_pending_checks, _start_checker)
            if settings.check_workers > 0
            else None
        )

    def start(self) -> None:
        if self.pool is not None:
            self.pool.start()

    @property
    def ready(self) -> bool:
        """Checks run at once: in the event loop's threads, or in checkers that have started."""
        return self.pool is None or self.pool.started

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()

    async def read(self, reader: Callable[..., Intake], body: bytes, *args: Any) -> Intake:
        """``reader(body, *args)``: in the event loop for a small body, else where checks run."""
        if len(body) <= self.settings.inline_check_bytes:
            return reader(body, *args)
        return await self._run(reader, body, *args)

    async def check(self, intake: Intake) -> None:
        await self._run(check, intake, self.limits)

    async def _run(self, function: Callable[..., Any], *args: Any) -> Any:
        cpu_s = self.settings.check_cpu_s
        if self.pool is None:
            outcome = await run_in_threadpool(_checked, None, function, *args)
        else:
            try:
                wall_s = cpu_s * WALL_TIMEOUT_FACTOR + START_ALLOWANCE_S
                outcome = await self.pool.run(wall_s, _checked, cpu_s, function, *args)
            except PoolBusy as error:
                message = f"{self.settings.max_pending_checks} submissions are being checked; retry later"
                raise too_busy(message, self.settings.retry_after_s) from error
            except PoolFailed as error:
                raise BadRequest("body", f"could not be checked: its checker {error}") from error
        return _answer(outcome, cpu_s)


def _start_checker(server: int) -> None:
    """A checker process: dies with the server, yields the CPU to it, one thread of torch, the checking code
    imported and run once (a first check paid 0.3 s more than the next ones in a new server)."""
    exit_with_server(server)
    # Checking a large document takes seconds of CPU; at the server's priority it would take the core the
    # event loop needs for cached reads (p99 of 10.8 s while a 3.7 MiB graph was checked on 2 cores).
    os.nice(CHECKER_NICENESS)
    import torch

    torch.set_num_threads(1)
    import strategies.graph.imported
    import strategies.models  # noqa: F401

    warm_up = read_plan(b'{"model": "mlp", "mesh": {"shape": [2]}}')
    check(warm_up, WARM_UP_LIMITS)


def _checked(cpu_s: float | None, function: Callable[..., Any], *args: Any) -> tuple:
    """``function(*args)`` as a picklable outcome: ``("ok", value)``, ``("bad", field, message, status)``,
    ``("slow",)`` past ``cpu_s`` CPU seconds, or ``("error", type name)`` for anything unexpected."""
    if cpu_s is not None:
        signal.signal(signal.SIGPROF, _on_cpu_limit)
        signal.setitimer(signal.ITIMER_PROF, cpu_s)
    try:
        return ("ok", function(*args))
    except BadRequest as error:
        return ("bad", error.field, error.message, error.status)
    except CheckTimeout:
        return ("slow",)
    except Exception as error:  # a gap in the checks: logged in full here, a 422 for the client
        log.exception("checking a submission failed")
        return ("error", type(error).__name__)
    finally:
        if cpu_s is not None:
            signal.setitimer(signal.ITIMER_PROF, 0)


def _on_cpu_limit(_signum: int, _frame: Any) -> None:
    raise CheckTimeout


def _answer(outcome: tuple, cpu_s: float) -> Any:
    kind = outcome[0]
    if kind == "ok":
        return outcome[1]
    if kind == "bad":
        raise BadRequest(outcome[1], outcome[2], status=outcome[3])
    if kind == "slow":
        raise BadRequest("body", f"checking it took more than {cpu_s:g} s of CPU (the server's limit)")
    raise BadRequest("body", f"could not be checked ({outcome[1]})")
