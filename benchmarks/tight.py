"""Solve memory-tight plans of small transformers: each zoo model on a 2x2 mesh at half its replicated peak.

    python benchmarks/tight.py [--models t5,vit,...] [--repeat 3] [--time-limit 60] [--gap 0.01]
                               [--threads 2] [--save DIR | --load DIR] [--json]

For each model of `tests/strategies/models/user_models/zoo.py` (2 layers, training mode): plan it with the
DDP layout (every parameter replicated) for its peak per device, build its problem again with half that
peak as the budget (as `autoshard plan --memory-gib` would), then solve that problem ``--repeat`` times in
this process with the planner's settings (limit, relative gap, 2 threads). A row per model: the median of
the repeats' wall and CPU seconds (this process's; the heuristic's forked searches are not counted), and
cost, bound, gap, status and what certified it in the run of median wall time; "runs" lists every run's
wall seconds. ``--save DIR`` also writes each problem as IOPDDL JSON (``<model>-2x2-half-memory.json.gz``;
the ViT one is the test suite's, `tests/bundled_data.py`); ``--load DIR`` solves those files instead of
capturing (another checkout's solver on the same problems: ``PYTHONPATH=<checkout> python
benchmarks/tight.py --load DIR``). `benchmarks/zoo_plans.py` times the same plans as whole `autoshard plan`
processes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from solver import iopddl
from solver.problem import Problem
from solver.solve import SolveOptions, solve, warm_up_kernels
from strategies.plan.planner import PlanRequest, plan_model
from tests.strategies.models.user_models.zoo import ARCHITECTURES

ZOO = "tests/strategies/models/user_models/zoo.py"
COLUMNS = ("model", "columns", "wall s", "cpu s", "cost", "bound", "gap", "status", "certified by", "runs")


def half_memory_problem(model: str) -> Problem:
    """The problem of ``model`` on a 2x2 mesh (dp, tp) with half its DDP peak per device as the budget."""
    replicated = PlanRequest(model=f"{ZOO}:{model}", mesh="2x2", axis_names="dp,tp", baseline="ddp")
    peak = plan_model(replicated).plan["predicted"]["peak_memory_bytes"]
    tight = PlanRequest(
        model=f"{ZOO}:{model}", mesh="2x2", axis_names="dp,tp", memory_gib=peak / 2 / 2**30, time_limit=10
    )
    return plan_model(tight).built.problem


def run(problem: Problem, time_limit: float, gap: float, threads: int) -> dict[str, Any]:
    started, cpu = time.perf_counter(), time.process_time()
    result = solve(problem, SolveOptions(time_limit=time_limit, threads=threads, relative_gap=gap))
    row = result.to_dict()
    row.pop("solution")
    row.update(wall=time.perf_counter() - started, cpu=time.process_time() - cpu)
    return row


def summary(model: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run of median wall time, with the medians of wall and CPU seconds and every run's wall."""
    walls = [r["wall"] for r in runs]
    middle = sorted(runs, key=lambda r: r["wall"])[len(runs) // 2]
    return {
        **middle,
        "model": model,
        "wall": statistics.median(walls),
        "cpu": statistics.median(r["cpu"] for r in runs),
        "runs": walls,
    }


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in rows:
        cells = [
            row["model"],
            f"{row['variables']:,}" if row.get("variables") else "-",
            f"{row['wall']:.1f}",
            f"{row['cpu']:.1f}",
            f"{row['cost']:.6g}" if row.get("cost") is not None else "-",
            f"{row['bound']:.6g}" if row.get("bound") is not None else "-",
            f"{100 * row['gap']:.2f}%" if row.get("gap") is not None else "-",
            row["status"],
            row["backend"],
            "/".join(f"{w:.1f}" for w in row["runs"]),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(ARCHITECTURES))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--gap", type=float, default=0.01)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--save", type=Path, default=None, help="write each problem here as IOPDDL JSON")
    parser.add_argument("--load", type=Path, default=None, help="solve the problems --save wrote there")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    args = parser.parse_args()
    warm_up_kernels()
    rows = []
    for model in args.models.split(","):
        saved = f"{model}-2x2-half-memory.json.gz"
        problem = iopddl.load(args.load / saved) if args.load is not None else half_memory_problem(model)
        if args.save is not None:
            args.save.mkdir(parents=True, exist_ok=True)
            iopddl.save(problem, args.save / saved)
        runs = [run(problem, args.time_limit, args.gap, args.threads) for _ in range(args.repeat)]
        rows.append(summary(model, runs))
        print(f"{model}: {rows[-1]['wall']:.1f} s wall, gap {rows[-1]['gap']}", file=sys.stderr, flush=True)
    print(json.dumps(rows, indent=1) if args.json else table(rows))


if __name__ == "__main__":
    main()
