"""Whole-pipeline planning benchmark: capture, build, solve and plan llama3-8b on large meshes.

    python benchmarks/plan.py [--configs 8x8,64,4x4x4,layers] [--time-limit 120] [--gap 0.01] [--repeat N]
                              [--json]

Configurations (issue 4): llama3-8b (bf16, sequence 8192) with 32 layers on a 1-D mesh of 64 (batch 128),
8x8 (batch 16) and 4x4x4 (batch 8); and 8 / 16 / 32 / 80 layers on 8x8 (batch 16), h100 preset, 80 GiB
per device (the mesh of 64 also at 160 GiB: nothing fits 80 GiB there without activation checkpointing).
Each configuration runs as a user runs it: `autoshard plan ...` in a fresh process. Its row: the command's
wall time from start to exit ("wall s"), the phases the plan records (capture, build, solve, and their
"total"), what lies outside them ("outside s": interpreter start, imports, writing and printing the plan,
exit), program size, certificate, peak memory and predicted step time, the process's peak RSS, and the best
hand-written baseline (DDP, FSDP, Megatron, FSDP x TP) solved on the same problem (once per configuration,
in a process of its own). A baseline faster than the plan (beyond the plan's gap) is flagged.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from strategies.plan.planner import PlanRequest, plan_model

ROOT = Path(__file__).resolve().parents[1]

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
    "wall s",
    "capture s",
    "build s",
    "solve s",
    "total s",
    "outside s",
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
    """One run of a configuration: `autoshard plan` in a fresh process, timed from start to exit. A planned
    row keeps the plan's request (``"request"``) for `add_best_baseline`."""
    row: dict = {"mesh": mesh, "layers": layers, "batch": batch, "budget GiB": memory_gib or 80}
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "plan.json"
        command = [sys.executable, "-m", "service.cli", "plan", "--model", "llama3-8b", "--mesh", mesh]
        command += ["--batch", str(batch), "--seq", "8192", "--layers", str(layers), "--out", str(out)]
        command += ["--time-limit", str(time_limit), "--gap", str(gap), "--quiet"]
        if memory_gib is not None:
            command += ["--memory-gib", str(memory_gib)]
        started = time.perf_counter()
        child = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(child.pid, 0)
        row["wall s"] = round(time.perf_counter() - started, 2)
        row["RSS GiB"] = round(usage.ru_maxrss / 2**20, 2)
        stderr = child.stderr.read().decode() if child.stderr else ""
        code = os.waitstatus_to_exitcode(status)
        if code == 3:  # no plan fits: the message names the smallest peak
            row["status"] = "infeasible: " + stderr.strip().removeprefix("autoshard: ")
            return row
        if code != 0:
            row["status"] = f"error (exit {code}): {stderr.strip()[-200:]}"
            return row
        plan = json.loads(out.read_text())
    timings = plan["timings"]
    solved_gap = plan["solver"]["gap"]
    row.update(
        {
            "capture s": round(timings["capture"], 2),
            "build s": round(timings["build"], 2),
            "solve s": round(timings["solve"], 2),
            "total s": round(timings["total"], 2),
            "outside s": round(row["wall s"] - timings["total"], 2),
            "variables": plan["solver"]["variables"],
            "status": plan["solver"]["status"],
            "gap": "-" if solved_gap is None else f"{100 * solved_gap:.2f}%",
            "peak GiB": round(plan["predicted"]["peak_memory_bytes"] / 2**30, 2),
            "step ms": round(plan["predicted"]["step_time_s"] * 1e3, 2),
            "request": plan["request"],
            "plan_step_time_s": plan["predicted"]["step_time_s"],
            "plan_gap": solved_gap,
        }
    )
    return row


def add_best_baseline(row: dict) -> None:
    """The fastest hand-written baseline on the problem of a planned row (in a process of its own), flagged
    when it beats the plan beyond the plan's gap."""
    if "request" not in row:
        return
    request = PlanRequest(**row["request"])
    best = _in_child(_best_baseline, request, request.time_limit)
    if best is None:
        row["best baseline"] = "none feasible"
        return
    name, step_time_s = best
    row["best baseline"] = name
    row["baseline ms"] = round(step_time_s * 1e3, 2)
    slack = (row["plan_gap"] or 0.0) * row["plan_step_time_s"]
    if row["plan_step_time_s"] > step_time_s + slack + 1e-12:
        row["best baseline"] += " (BEATS THE PLAN)"


def _best_baseline(request: PlanRequest, time_limit: float) -> tuple[str, float] | None:
    """(name, step time) of the fastest feasible baseline on the problem of ``request``."""
    from strategies.plan.baselines import solve_baselines

    outcome = plan_model(request)
    baselines = [b for b in solve_baselines(outcome.built, time_limit=time_limit) if b.feasible]
    if not baselines:
        return None
    best = min(baselines, key=lambda b: b.step_time_s)
    return best.name, best.step_time_s


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

    warm_up_kernels()  # the baselines' children inherit the loaded numba kernels
    columns = COLUMNS if args.repeat <= 1 else (*COLUMNS, RUNS_COLUMN)
    rows = []
    print("| " + " | ".join(columns) + " |\n|" + "---|" * len(columns), flush=True)
    for name in args.configs.split(","):
        for mesh, batch, layers, memory_gib in CONFIGS[name]:
            runs = [
                run(mesh, batch, layers, memory_gib, args.time_limit, args.gap) for _ in range(args.repeat)
            ]
            row = _median_run(runs)
            add_best_baseline(row)
            for internal in ("request", "plan_step_time_s", "plan_gap"):
                row.pop(internal, None)
            rows.append(row)
            if not args.json:
                print(
                    "| " + " | ".join(_cell(row.get(c, "-")) for c in columns) + " |",
                    flush=True,
                )
    if args.json:
        print(json.dumps(rows, indent=1))


def _in_child(function: Callable[..., Any], *args: object) -> Any:
    """``function(*args)`` in a forked process of its own (not a pool worker: the solver forks its own
    workers), so one configuration's memory does not stay in the next."""
    context = multiprocessing.get_context("fork")
    results = context.Queue()

    def child_main() -> None:
        try:
            results.put(function(*args))
        except Exception:  # a failed baseline is "none feasible", not a hung benchmark
            results.put(None)
            raise

    child = context.Process(target=child_main)
    child.start()
    row = results.get()
    child.join()
    return row


#: With --repeat: every run's wall seconds, in order.
RUNS_COLUMN = "runs wall s"


def _median_run(runs: list[dict]) -> dict:
    """The run of median wall time (of an even count, the slower middle one), with every run's wall time.
    This machine's timings drift by tens of percent between runs: one run decides nothing near a target."""
    timed = [r for r in runs if isinstance(r.get("wall s"), (int, float))]
    if not timed:
        return runs[-1]
    row = dict(sorted(timed, key=lambda r: r["wall s"])[len(timed) // 2])
    if len(runs) > 1:
        row[RUNS_COLUMN] = "/".join(str(r.get("wall s", "-")) for r in runs)
    return row


def _cell(value: object) -> str:
    return f"{value:,}" if isinstance(value, int) else str(value)


if __name__ == "__main__":
    main()
