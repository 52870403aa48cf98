"""Start the ranks of `autoshard run`: PyTorch's elastic launcher here, or the caller's `torchrun`.

Inside `torchrun` (``RANK`` and ``WORLD_SIZE`` set) the command is one rank and runs it. Otherwise it starts
``nproc`` local ranks through ``torch.distributed.launcher.elastic_launch`` (the launcher behind
`torchrun`), on a free port of 127.0.0.1: a rank that fails makes the launcher stop the others, so a dead
rank ends the run instead of hanging it, and its error comes back naming the rank. What can be refused
before any rank starts (the plan file, its version, a mesh that needs another number of ranks) is.

An expected failure (bad input, a failed check, an op DTensor cannot run as planned) ends in one line naming
what failed and what to do: the rank marks its message, and the launcher's log of the rank's traceback is
left out for it (a traceback stays for anything else, a bug's).
"""

from __future__ import annotations

import json
import logging
import math
import multiprocessing
import os
import socket
import time
import uuid
from pathlib import Path
from typing import Any

from runtime.one_process import CheckFailed
from runtime.parameter_shards import open_weights
from runtime.plan_checks import PlanMismatch, check_plan
from runtime.planned_step import OpFailed
from runtime.run_setup import RunOptions, check_world, load_plan, model_mismatch

#: Exit codes of `autoshard run`.
EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2


class RunFailed(RuntimeError):
    """A rank failed; ``exit_code`` is what `autoshard run` exits with."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def in_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def check_before_start(options: RunOptions, nproc: int | None) -> int:
    """The number of ranks to start (``nproc``, default the plan's mesh size), after refusing what needs no
    rank to refuse."""
    plan = load_plan(options.plan)
    check_plan(plan)
    world = int(os.environ["WORLD_SIZE"]) if in_torchrun() else (nproc or math.prod(plan["mesh"]["shape"]))
    check_world(plan, world)
    check_model_builds(plan, options.model)
    if options.load and not (Path(options.load) / ".metadata").is_file():
        raise PlanMismatch(f"--load: {options.load} holds no checkpoint")
    if options.weights:
        try:
            open_weights(options.weights)
        except (ValueError, OSError) as error:
            raise PlanMismatch(f"--weights: {error}") from None
    if options.backend not in ("gloo", "nccl"):
        raise PlanMismatch(f"--backend: unknown backend {options.backend!r}; choose gloo or nccl")
    if options.device not in ("cpu", "cuda"):
        raise PlanMismatch(f"--device: unknown device {options.device!r}; choose cpu or cuda")
    return world


def check_model_builds(plan: dict[str, Any], model: str) -> None:
    """Refuse a named model the plan's shapes and options do not build, built here on the meta device
    (nothing allocated) before any rank starts. A factory (``path:function``) fixes its own device, so it is
    built only by the ranks, which refuse it the same way."""
    if ":" in model:
        return
    from strategies.plan.planner import PlanRequest, build_request_model

    request = PlanRequest(**plan["request"])
    try:
        build_request_model(request, model, request.layers, "meta")
    except ValueError as error:
        raise model_mismatch(request.model, model, error) from error


def run(options: RunOptions, nproc: int | None = None) -> dict[str, Any]:
    """Run the plan on every rank; the report of rank 0. Raises :class:`PlanMismatch` for bad input found
    before the start, :class:`RunFailed` when a rank failed."""
    world = check_before_start(options, nproc)
    if in_torchrun():
        return rank_main(options)
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=world,
        run_id=f"autoshard-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d",
        rdzv_endpoint=f"127.0.0.1:{_free_port()}",
        max_restarts=0,
        monitor_interval=0.2,
        start_method=rank_start_method(),
    )
    launcher_log = logging.getLogger(LAUNCHER_LOGGER)
    quiet = _ExpectedFailures()
    launcher_log.addFilter(quiet)
    try:
        reports = elastic_launch(config, rank_main)(options)
    except ChildFailedError as error:
        raise _failure(error) from None
    finally:
        launcher_log.removeFilter(quiet)
    return reports[0]


#: What the ranks' fork server imports once before forking them: each rank starts as a fork of it instead of a
#: new interpreter importing torch, DTensor and the runtime again (on 2 cores, 4 spawned ranks spent 3-4 s of
#: CPU each on those imports before their first op).
RANK_PRELOAD = (
    "torch",
    "torch.distributed",
    "torch.distributed.tensor",
    "runtime.launch",
    "runtime.worker",
    "runtime.planned_step",
    "strategies.plan.planner",
    "strategies.graph.passes",
    "strategies.ops.dtensor_bridge",
)


def rank_start_method() -> str:
    """How the launcher starts ranks: forked from a fork server that imported `RANK_PRELOAD` (CUDA is not
    initialised there: each rank initialises its own device), or spawned where there is no fork."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return "spawn"
    multiprocessing.set_forkserver_preload(list(RANK_PRELOAD))
    return "forkserver"


def rank_main(options: RunOptions) -> dict[str, Any]:
    """One rank: join the process group the launcher set up, run, write the report (rank 0)."""
    import torch.distributed as dist

    from runtime.worker import run_rank

    dist.init_process_group(options.backend)
    try:
        report = run_rank(options)
    except BaseException as error:
        if any(words in str(error) for words in LOST_PEER):
            time.sleep(LOST_PEER_GRACE_S)  # the launcher sees the dead peer first and names it
        if isinstance(error, PlanMismatch):
            raise RuntimeError(f"{ERROR_MARK}{EXIT_BAD_INPUT}:{error}") from None
        if isinstance(error, (CheckFailed, OpFailed)):
            raise RuntimeError(f"{ERROR_MARK}{EXIT_FAILED}:{error}") from None
        raise
    finally:
        dist.destroy_process_group()
    if options.report and int(os.environ.get("RANK", "0")) == 0:
        Path(options.report).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return report


#: What a rank's error says when a peer died under a collective (gloo; NCCL), and how long that rank waits
#: before failing: the launcher reports the first rank it sees fail, and a survivor's "Connection reset by
#: peer" (at once) would hide the rank that died (seen with ranks forked from the fork server).
LOST_PEER = ("Connection reset by peer", "Connection closed by peer", "remote process exited")
LOST_PEER_GRACE_S = 2.0


#: How a rank marks the message of an expected failure (bad input, a failed check) for the launcher.
ERROR_MARK = "autoshard-run-error:"

#: The logger through which PyTorch's elastic launcher logs a failed rank's traceback.
LAUNCHER_LOGGER = "torch.distributed.elastic.multiprocessing.api"


class _ExpectedFailures(logging.Filter):
    """Drops the launcher's record of a rank's marked failure: `autoshard run` says it in one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return error is None or ERROR_MARK not in str(error)


def _failure(error: Any) -> RunFailed:
    """The first failed rank's error as one message (its own words when it said them)."""
    rank, failure = min(error.failures.items())
    message = failure.message
    text = message.get("message", "") if isinstance(message, dict) else str(message or "")
    text = text if isinstance(text, str) else json.dumps(text)
    if ERROR_MARK in text:
        code, _, said = text[text.index(ERROR_MARK) + len(ERROR_MARK) :].partition(":")
        return RunFailed(f"rank {rank}: {said.strip().splitlines()[0]}", int(code))
    lines = [line for line in text.strip().splitlines() if line.strip()]
    reason = lines[-1] if lines else f"exit code {failure.exitcode}"
    return RunFailed(f"rank {rank} failed: {reason}", EXIT_FAILED)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
