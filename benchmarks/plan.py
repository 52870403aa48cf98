"""Whole-pipeline planning benchmark: capture, build, solve and plan llama3-8b on large meshes.

    python benchmarks/plan.py [--configs 8x8,64,4x4x4,layers] [--time-limit 120] [--gap 0.01] [--repeat N]
                              [--json]

Configurations (issue 4): llama3-8b (bf16, sequence 8192) with 32 layers on a 1-D mesh of 64 (batch 128),
8x8 (batch 16) and 4x4x4 (batch 8); and 8 / 16 / 32 / 80 layers on 8x8 (batch 16), h100 preset, 80 GiB
per device (the mesh of 64 also at 160 GiB: nothing fits 80 GiB there without activation checkpointing).
Prints one table row per configuration: seconds per phase, program size, certificate, peak memory and
predicted step time, the best hand-written baseline (DDP, FSDP, Megatron, FSDP x TP) solved on the same
problem, and the process's peak RSS. A baseline faster than the plan (beyond the plan's gap) is flagged.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from strategies.planner import PlanRequest, plan_model

CONFIGS = {
    # (mesh, batch, layers, memory budget GiB or None for the hardware's 80 GiB)
    "64": [("64", 128, 32, None), ("64", 128, 32, 160.0)],
    "8x8": [("8x8", 16, 32, None)],
    "4x4x4": [("4x4x4", 8, 32, None)],
    "layers": [("8x8", 16, n, None) for n in (8, 16, 32, 80)],
}
COLUMNS = (
    "mesh",
    "layers",
    "batch",
    "budget GiB",
    "capture s",
    "build s",
    "solve s",
    "total s",
    "variables",
    "status",
    "gap",
    "peak GiB",
    "step ms",
    "best baseline",
    "baseline ms",
    "RSS GiB",
)


def run(mesh: str, batch: int, layers: int, memory_gib: float | None, time_limit: float, gap: float) -> dict:
    from solver.errors import InfeasibleError
    from strategies.baselines import solve_baselines

    started = time.perf_counter()
    request = PlanRequest(
        model="llama3-8b",
        mesh=mesh,
        batch=batch,
        seq=8192,
        layers=layers,
        time_limit=time_limit,
        gap=gap,
        memory_gib=memory_gib,
    )
    row: dict = {"mesh": mesh, "layers": layers, "batch": batch, "budget GiB": memory_gib or 80}
    try:
        outcome = plan_model(request)
    except InfeasibleError as error:
        peak = getattr(error, "min_peak", None)
        row["status"] = "infeasible" + (f" (smallest peak >= {peak / 2**30:.1f} GiB)" if peak else "")
        row["total s"] = round(time.perf_counter() - started, 2)
        return row
    plan = outcome.plan
    timings = plan["timings"]
    solved_gap = plan["solver"]["gap"]
    row.update(
        {
            "capture s": round(timings["capture"], 2),
            "build s": round(timings["build"], 2),
            "solve s": round(timings["solve"], 2),
            "total s": round(time.perf_counter() - started, 2),
            "variables": plan["solver"]["variables"],
            "status": plan["solver"]["status"],
            "gap": "-" if solved_gap is None else f"{100 * solved_gap:.2f}%",
            "peak GiB": round(plan["predicted"]["peak_memory_bytes"] / 2**30, 2),
            "step ms": round(plan["predicted"]["step_time_s"] * 1e3, 2),
            "RSS GiB": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
        }
    )
    baselines = [b for b in solve_baselines(outcome.built, time_limit=time_limit) if b.feasible]
    if baselines:
        best = min(baselines, key=lambda b: b.step_time_s)
        row["best baseline"] = best.name
        row["baseline ms"] = round(best.step_time_s * 1e3, 2)
        slack = (solved_gap or 0.0) * plan["predicted"]["step_time_s"]
        if plan["predicted"]["step_time_s"] > best.step_time_s + slack + 1e-12:
            row["best baseline"] += " (BEATS THE PLAN)"
    else:
        row["best baseline"] = "none feasible"
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--configs", default="8x8,64,4x4x4,layers", help="comma list of " + ", ".join(CONFIGS)
    )
    parser.add_argument("--time-limit", type=float, default=120.0, help="solver seconds per configuration")
    parser.add_argument("--gap", type=float, default=0.01, help="relative gap the solver may stop at")
    parser.add_argument("--json", action="store_true", help="print JSON rows instead of a table")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs per configuration; the row shown is the run of median total time, with every total",
    )
    args = parser.parse_args()
    from solver.solve import warm_up_kernels

    warm_up_kernels()  # load the numba kernels once (as a running service has them); children inherit them
    columns = COLUMNS if args.repeat <= 1 else (*COLUMNS, RUNS_COLUMN)
    rows = []
    print("| " + " | ".join(columns) + " |\n|" + "---|" * len(columns), flush=True)
    for name in args.configs.split(","):
        for mesh, batch, layers, memory_gib in CONFIGS[name]:
            runs = [
                _in_child(mesh, batch, layers, memory_gib, args.time_limit, args.gap)
                for _ in range(max(1, args.repeat))
            ]
            row = _median_run(runs)
            rows.append(row)
            if not args.json:
                print(
                    "| " + " | ".join(_cell(row.get(c, "-")) for c in columns) + " |",
                    flush=True,
                )
    if args.json:
        print(json.dumps(rows, indent=1))


def _in_child(*args: object) -> dict:
    """`run` in a forked process of its own (not a pool worker: the solver forks its own workers), so
    "RSS GiB" is that configuration's peak."""
    context = multiprocessing.get_context("fork")
    results = context.Queue()

    def child_main() -> None:
        try:
            results.put(run(*args))  # type: ignore[arg-type]
        except Exception as error:  # a failed configuration is a row, not a hung benchmark
            results.put({"mesh": args[0], "layers": args[2], "batch": args[1], "status": f"error: {error}"})
            raise

    child = context.Process(target=child_main)
    child.start()
    row = results.get()
    child.join()
    return row


#: With --repeat: every run's total seconds, in order.
RUNS_COLUMN = "runs total s"


def _median_run(runs: list[dict]) -> dict:
    """The run of median total time (of an even count, the slower middle one), with every run's total. This
    machine's timings drift by tens of percent between runs: one run decides nothing near a target."""
    timed = [r for r in runs if isinstance(r.get("total s"), (int, float))]
    if not timed:
        return runs[-1]
    row = dict(sorted(timed, key=lambda r: r["total s"])[len(timed) // 2])
    if len(runs) > 1:
        row[RUNS_COLUMN] = "/".join(str(r.get("total s", "-")) for r in runs)
    return row


def _cell(value: object) -> str:
    return f"{value:,}" if isinstance(value, int) else str(value)


if __name__ == "__main__":
    main()
