"""The checker's limits, without a server: a check past its CPU-time limit is stopped and refused, a
pool call past its wall-clock limit or whose process dies renews the pool, a full pool answers busy, and a
pool process exits when its parent is gone."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import pytest

from service.app.checker import _answer, _checked
from service.processes import PoolBusy, PoolFailed, ProcessPool, exit_with_server, process_running
from service.submissions import BadRequest


def spin(seconds: float) -> str:
    """Burn CPU for ``seconds`` (even inside ``except Exception``: the limit must still stop it)."""
    deadline = time.process_time() + seconds
    while time.process_time() < deadline:
        try:
            sum(range(1000))
        except Exception:  # what a careless library does
            continue
    return "done"


def refuse() -> None:
    raise BadRequest("graph.nodes[3].op", "unknown op", status=422)


def die() -> None:
    os._exit(3)


def test_a_check_past_its_cpu_limit_is_stopped_and_refused() -> None:
    started = time.perf_counter()
    outcome = _checked(0.3, spin, 30.0)
    assert outcome == ("slow",) and time.perf_counter() - started < 5
    with pytest.raises(BadRequest, match=r"more than 0\.3 s of CPU"):
        _answer(outcome, 0.3)
    assert _checked(5.0, spin, 0.05) == ("ok", "done")


def test_a_refusal_crosses_the_process_boundary_naming_its_field() -> None:
    outcome = _checked(1.0, refuse)
    with pytest.raises(BadRequest) as refused:
        _answer(outcome, 1.0)
    assert refused.value.field == "graph.nodes[3].op" and refused.value.status == 422


def test_a_pool_renews_itself_after_a_stuck_or_dead_process_and_answers_busy_when_full() -> None:
    pool = ProcessPool("test", workers=1, max_pending=1, initializer=exit_with_server)

    async def scenario() -> None:
        with pytest.raises(PoolFailed, match=r"more than 0\.5 s"):
            await pool.run(0.5, spin, 30.0)
        with pytest.raises(PoolFailed, match="died"):
            await pool.run(30.0, die)
        assert await pool.run(30.0, spin, 0.01) == "done"
        running = asyncio.ensure_future(pool.run(30.0, spin, 0.5))
        await asyncio.sleep(0.05)
        with pytest.raises(PoolBusy):
            await pool.run(30.0, spin, 0.01)
        assert await running == "done"

    try:
        asyncio.run(scenario())
    finally:
        pool.close()


def test_a_child_exits_when_its_parent_dies() -> None:
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, subprocess, sys, time\n"
            "child = subprocess.Popen([sys.executable, '-c', 'import os, time\\n"
            "from service.processes import exit_with_server\\n"
            "exit_with_server(os.getppid())\\n"
            "time.sleep(60)'])\n"
            "print(child.pid, flush=True)\n"
            "time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=os.getcwd(),
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    time.sleep(1.0)  # the child has started its watch
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 5
    while process_running(child):
        assert time.monotonic() < deadline, "the child outlived its parent"
        time.sleep(0.05)


def test_a_pool_says_it_has_started_once_its_initializers_have_run() -> None:
    """/readyz answers 'not ready' until the checkers have started: a first request never waits for one."""
    pool = ProcessPool("test", workers=1, max_pending=1, initializer=_slow_start, initargs=(1.0,))
    try:
        assert not pool.started  # not asked to start
        pool.start()
        assert not pool.started  # its initializer is still sleeping
        deadline = time.monotonic() + 60
        while not pool.started:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        began = time.perf_counter()
        assert asyncio.run(pool.run(30, os.getpid)) != os.getpid()
        assert time.perf_counter() - began < 0.5  # it did not wait for a start
    finally:
        pool.close()


def _slow_start(parent: int, seconds: float) -> None:
    exit_with_server(parent)
    time.sleep(seconds)
