"""A pipeline plan's step on torch's stages against the runtime's own loop, on the same ranks, side by side.

    python benchmarks/pipeline_runners.py [--steps 12]

For each case (planned here, float32, one 4-rank gloo group on 127.0.0.1), every rank applies the plan
(`runtime.apply.apply_plan`) and runs steps on the same inputs, alternating the two runners of
`runtime.pipeline_step.PipelineStep`: `torch.distributed.pipelining`'s `PipelineStage` objects under torch's
schedule class (`runtime.pipeline_stages`), and the runtime's own loop (the same actions, its own sends).
Steps alternate so both meet the same load. The table gives each runner's median step (after one warm-up
step of each), their ratio, the loss of each (equal: the same step), and the point-to-point bytes each sent
(equal: the plan's).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 4
GPT = {"dim": 128, "n_heads": 4, "vocab_size": 256, "max_seq_len": 64, "ffn_dim": 512}
GPT["tie_embeddings"] = False  # the runs of tests/runtime/test_pipeline_run.py's untied cases
CASES: dict[str, dict[str, Any]] = {
    "gpt 2 layers, pp 2 x dp 2, 1f1b": {
        "model": "gpt2-small", "batch": 8, "seq": 32, "layers": 2, "options": GPT,
        "mesh": "2x2", "axis_names": "pp,dp", "schedule": "1f1b",
    },
    "gpt 4 layers, pp 4, zero-bubble": {
        "model": "gpt2-small", "batch": 8, "seq": 32, "layers": 4, "options": GPT,
        "mesh": "4", "axis_names": "pp", "schedule": "zero-bubble",
    },
    "gpt 4 layers, pp 2 x dp 2, interleaved-1f1b": {
        "model": "gpt2-small", "batch": 8, "seq": 32, "layers": 4, "options": GPT,
        "mesh": "2x2", "axis_names": "pp,dp", "schedule": "interleaved-1f1b",
    },
    "gpt 2 layers, pp 2 x tp 2, gpipe": {
        "model": "gpt2-small", "batch": 8, "seq": 32, "layers": 2, "options": GPT,
        "mesh": "2x2", "axis_names": "pp,tp", "schedule": "gpipe",
    },
}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12, help="steps of each runner, after one warm-up each")
    args = parser.parse_args()
    from strategies.plan.planner import PlanRequest, plan_model

    print("| case | torch's stages: step ms | own loop: step ms | own / torch | loss equal | sent per rank |")
    print("|---|---|---|---|---|---|")
    for name, fields in CASES.items():
        plan = plan_model(PlanRequest(dtype="float32", time_limit=30, hardware="cpu", **fields)).plan
        results = mp.get_context("spawn").Manager().list()
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        mp.spawn(_rank, args=(port, plan, fields["model"], args.steps, results), nprocs=WORLD, join=True)
        first = min(results, key=lambda r: r["rank"])
        torch_ms, own_ms = (statistics.median(first[runner]) * 1e3 for runner in ("torch", "own"))
        sent = {runner: sorted({r["sent"][runner] for r in results}) for runner in ("torch", "own")}
        print(
            f"| {name} | {torch_ms:.1f} | {own_ms:.1f} | {own_ms / torch_ms:.2f} | "
            f"{all(r['losses']['torch'] == r['losses']['own'] for r in results)} | "
            f"torch {sent['torch']}, own {sent['own']} |",
            flush=True,
        )


def _rank(rank: int, port: int, plan: dict[str, Any], model: str, steps: int, results: Any) -> None:
    from runtime.apply import apply_plan
    from runtime.plan_checks import run_mesh
    from runtime.run_setup import RunOptions, build_run_model
    from runtime.worker import device_mesh
    from strategies.graph.capture import input_tensors

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        mesh = device_mesh("cpu", *run_mesh(plan))
        spec, short = build_run_model(RunOptions(model=model, plan=""), plan)
        applied = apply_plan(spec.module, plan, mesh, spec.example_inputs, spec.loss_fn, short_graph=short)
        step = applied.step
        torch_stages = step.torch_stages
        assert torch_stages is not None, step.own_loop_because
        inputs = input_tensors(spec.example_inputs)
        seconds: dict[str, list[float]] = {"torch": [], "own": []}
        losses: dict[str, float] = {}
        sent: dict[str, int] = {}
        for index in range(steps + 1):
            for runner in ("torch", "own"):
                step.torch_stages = torch_stages if runner == "torch" else None
                dist.barrier()
                started = time.perf_counter()
                result = applied.forward_backward(inputs)
                elapsed = time.perf_counter() - started
                if index:
                    seconds[runner].append(elapsed)
                losses[runner] = float(result.loss.to_local())
                sent[runner] = step.measured.sent_bytes
        results.append({"rank": rank, **{"torch": seconds["torch"], "own": seconds["own"]}, "losses": losses,
                        "sent": sent})  # fmt: skip
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
