"""The service's child processes: each one dies with the server (SIGKILL included), and pools of them
that a request waits on without holding the event loop.

Children start from a fork server (:func:`child_context`) that imported torch, the planner, the solver and
the checking code once: each child is a fork of it, ready in a fraction of a second, where a spawned child
imported all of that again (4-7 s of CPU for each worker and checker of every server start, and for every
worker replaced after a canceled job). The fork server exits when the server dies (its pipe from the server
closes) and the last child it forked is gone. A child polls the server's pid (:func:`exit_with_server`): when
the server is killed, the children notice within :data:`PARENT_CHECK_S` and exit, and with them go the fork
server and multiprocessing's resource tracker (each exits once the last process holding its pipe is gone).
:class:`ProcessPool` runs functions in such children, at most ``max_pending`` at once (more:
:class:`PoolBusy`), each within a wall-clock limit past which the pool's processes are killed and replaced
(:class:`PoolFailed`), as when one of them dies.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.context import BaseContext
from pathlib import Path
from typing import Any

log = logging.getLogger("autoshard.processes")
PARENT_CHECK_S = 0.5
#: What the fork server imports before its first fork: what the worker, checker and explain processes run.
PRELOAD = (
    "torch",
    "solver.solve",
    "strategies.plan.planner",
    "strategies.graph.imported",
    "strategies.models",
    "service.planning",
    "service.explaining",
    "service.jobs.worker",
    "service.app.checker",
    "service.app.explain",
)


def child_context() -> BaseContext:
    """The context the server's children start in: the fork server, with `PRELOAD`."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(PRELOAD))
    return context


def exit_with_server(server: int) -> None:
    """Exit this process as soon as the process ``server`` is gone: a watch thread. The child's own parent is
    the fork server, which stays while any child it forked lives (each holds its pipe): it cannot tell."""

    def watch() -> None:
        while True:
            if not process_running(server):
                os._exit(1)
            time.sleep(PARENT_CHECK_S)

    threading.Thread(target=watch, name="server-watch", daemon=True).start()


def process_running(pid: int) -> bool:
    """``pid`` exists and is not a zombie (a server killed but not yet reaped is gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: the pid was reused, the server is gone
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):  # no /proc (macOS): signal 0 said it runs
        return True


class PoolBusy(Exception):
    """Every place of the pool is taken: the caller answers 429."""


class PoolFailed(Exception):
    """The call ran past its wall-clock limit or its process died; the pool was renewed."""


class ProcessPool:
    """``workers`` processes from the fork server (started on first use or by :meth:`start`), each running
    ``initializer(server pid, *initargs)`` first."""

    def __init__(
        self,
        name: str,
        workers: int,
        max_pending: int,
        initializer: Callable[..., None],
        initargs: tuple[Any, ...] = (),
    ) -> None:
        self.name = name
        self.workers = workers
        self.max_pending = max_pending
        self.initializer = initializer
        self.initargs = initargs
        self.pending = 0
        self._executor: ProcessPoolExecutor | None = None
        self._starting: list[Future] = []
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start the processes now (they import what they need while nothing waits on them)."""
        executor = self._get()
        self._starting = [executor.submit(time.sleep, 0) for _ in range(self.workers)]

    @property
    def started(self) -> bool:
        """Every process started by :meth:`start` has run its initializer (no request waits for one)."""
        return bool(self._starting) and all(future.done() for future in self._starting)

    async def run(self, timeout_s: float, function: Callable[..., Any], *args: Any) -> Any:
        """``function(*args)`` in a pool process; PoolBusy when ``max_pending`` calls are under way,
        PoolFailed when it takes more than ``timeout_s`` or its process dies."""
        if self.pending >= self.max_pending:
            raise PoolBusy(f"{self.name}: {self.pending} requests under way")
        self.pending += 1
        executor = self._get()
        try:
            future = executor.submit(function, *args)
            return await asyncio.wait_for(asyncio.wrap_future(future), timeout_s)
        except TimeoutError as error:
            log.warning("%s: a call ran past %.0f s: its processes are replaced", self.name, timeout_s)
            self._renew(executor)
            raise PoolFailed(f"took more than {timeout_s:g} s") from error
        except BrokenProcessPool as error:
            log.warning("%s: a process died: the pool is renewed", self.name)
            self._renew(executor)
            raise PoolFailed("its process died") from error
        finally:
            self.pending -= 1

    def close(self) -> None:
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            _kill(executor)

    def _get(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = ProcessPoolExecutor(
                    max_workers=self.workers,
                    mp_context=child_context(),
                    initializer=self.initializer,
                    initargs=(os.getpid(), *self.initargs),
                )
            return self._executor

    def _renew(self, executor: ProcessPoolExecutor) -> None:
        with self._lock:
            if self._executor is executor:
                self._executor = None
        _kill(executor)


def _kill(executor: ProcessPoolExecutor) -> None:
    """Stop a pool now: its processes are killed (a stuck call is never waited for)."""
    processes = list((getattr(executor, "_processes", None) or {}).values())
    for process in processes:
        if process.is_alive():
            process.kill()
    executor.shutdown(wait=False, cancel_futures=True)
