"""The planned step against the same layout written by hand, on the same ranks; bytes predicted vs measured.

    python benchmarks/runtime.py [--steps 20] [--nproc 4] [--d 1024] [--h 4096] [--batch 512]

For the ``mlp`` model (float32, one 4-rank gloo group on 127.0.0.1) and each layout, the plan of
that layout (`autoshard plan --baseline ...`) runs through `runtime.apply.apply_plan`, and the same layout
written by hand runs as eager PyTorch: Megatron with ``parallelize_module`` (``w1`` column-parallel, ``w2``
row-parallel), FSDP with ``fully_shard`` (each rank its part of the batch). Each does the same steps of SGD on
the same weights, their steps taken in turn so both meet the same load; the table gives the median step
time of each (after one warm-up step), their ratio (hand-written / planned: 0.95 or more is the target), and
the bytes per rank the plan predicted against those a first planned step moved (gloo has no all-to-all:
DTensor all-gathers, which moves more).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

LAYOUTS = ("megatron", "fsdp")
COLUMNS = (
    "layout",
    "mesh",
    "planned step ms",
    "hand-written step ms",
    "hand / planned",
    "bytes plan",
    "bytes run",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--d", type=int, default=1024)
    parser.add_argument("--h", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=512)
    args = parser.parse_args()
    from strategies.plan.planner import PlanRequest, plan_model

    with tempfile.TemporaryDirectory() as scratch:
        plans = {}
        for layout in LAYOUTS:
            request = PlanRequest(
                model="mlp", mesh=str(args.nproc), batch=args.batch, dtype="float32",
                options={"d": args.d, "h": args.h}, baseline=layout, time_limit=30,
            )  # fmt: skip
            path = Path(scratch) / f"{layout}.json"
            path.write_text(json.dumps(plan_model(request).plan), encoding="utf-8")
            plans[layout] = str(path)
        results = mp.get_context("spawn").SimpleQueue()
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        mp.start_processes(
            _rank, args=(args.nproc, port, plans, args, results), nprocs=args.nproc, start_method="spawn"
        )
        rows = results.get()
    print("| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS))
    for row in rows:
        print("| " + " | ".join(str(row[c]) for c in COLUMNS) + " |")


def _rank(rank: int, world: int, port: int, plans: dict[str, str], args: Any, results: Any) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    rows = []
    for layout in LAYOUTS:
        plan = json.loads(Path(plans[layout]).read_text(encoding="utf-8"))
        planned, measured_bytes = _planned(plan, mesh, args)
        hand = _hand_written(layout, mesh, args)
        planned_ms, hand_ms = _alternating(planned, hand, args.steps)
        rows.append(
            {
                "layout": layout,
                "mesh": f"({world},)",
                "planned step ms": round(planned_ms, 2),
                "hand-written step ms": round(hand_ms, 2),
                "hand / planned": round(hand_ms / planned_ms, 3),
                "bytes plan": f"{plan['predicted']['comm_bytes']:,}",
                "bytes run": f"{measured_bytes:,}",
            }
        )
    if rank == 0:
        results.put(rows)
    dist.destroy_process_group()


def _model(args: Any) -> Any:
    from strategies.models import build_model

    torch.manual_seed(0)
    return build_model("mlp", batch=args.batch, seq=1, dtype=torch.float32, device="cpu", d=args.d, h=args.h)


def _alternating(planned: Callable[[], None], hand: Callable[[], None], steps: int) -> tuple[float, float]:
    """Median milliseconds of each step function, their steps taken in turn (one warm-up each), so both see
    the same machine: on a shared 2-core host, load that comes and goes would otherwise favour one."""
    planned(), hand()
    seconds: dict[Callable[[], None], list[float]] = {planned: [], hand: []}
    for _ in range(steps):
        for step in (planned, hand):
            dist.barrier()
            started = time.perf_counter()
            step()
            seconds[step].append(time.perf_counter() - started)
    return 1e3 * statistics.median(seconds[planned]), 1e3 * statistics.median(seconds[hand])


def _planned(plan: dict[str, Any], mesh: Any, args: Any) -> tuple[Callable[[], None], int]:
    """One SGD step of the plan applied by the runtime, and the bytes a first step moved."""
    from runtime.apply import apply_plan
    from runtime.collectives import CountCollectives
    from strategies.graph.capture import input_tensors

    spec = _model(args)
    applied = apply_plan(spec.module, plan, mesh, spec.example_inputs, spec.loss_fn)
    optimizer = torch.optim.SGD(applied.parameters.values(), lr=1e-6)
    inputs = input_tensors(spec.example_inputs)
    with CountCollectives() as sizes:  # a first step, weighed (the mode costs time: not a timed step)
        applied.forward_backward(inputs)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        applied.forward_backward(inputs)
        optimizer.step()

    return step, sum(sizes.nbytes.values())


def _hand_written(layout: str, mesh: Any, args: Any) -> Callable[[], None]:
    """One SGD step of the layout written with PyTorch's own APIs, eager."""
    spec = _model(args)
    module = spec.module
    x, target = spec.example_inputs
    if layout == "megatron":
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        parallelize_module(module, mesh, {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
    else:
        from torch.distributed.fsdp import fully_shard

        fully_shard(module, mesh=mesh)
        rank, world = mesh.get_local_rank(), mesh.size()
        x, target = (t.chunk(world)[rank] for t in (x, target))  # FSDP: each rank its part of the batch
    optimizer = torch.optim.SGD(module.parameters(), lr=1e-6)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        module(x, target).backward()
        optimizer.step()

    return step


if __name__ == "__main__":
    main()
