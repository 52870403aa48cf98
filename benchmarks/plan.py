"""Whole-pipeline planning benchmark: capture, build, solve and plan llama3-8b on large meshes.

    python benchmarks/plan.py [--configs 8x8,64,4x4x4,layers] [--time-limit 120] [--json]

Configurations (issue 4): llama3-8b (bf16, sequence 8192) with 32 layers on a 1-D mesh of 64 (batch 128),
8x8 (batch 16) and 4x4x4 (batch 8); and 8 / 16 / 32 / 80 layers on 8x8 (batch 16). Prints one table row
per configuration: seconds per phase, program size, certificate, peak memory and predicted step time, and
the process's peak RSS.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from strategies.planner import PlanRequest, plan_model

CONFIGS = {
    "64": [("64", 128, 32)],
    "8x8": [("8x8", 16, 32)],
    "4x4x4": [("4x4x4", 8, 32)],
    "layers": [("8x8", 16, n) for n in (8, 16, 32, 80)],
}
COLUMNS = (
    "mesh",
    "layers",
    "batch",
    "capture s",
    "build s",
    "solve s",
    "total s",
    "variables",
    "status",
    "gap",
    "peak GiB",
    "step ms",
    "RSS GiB",
)


def run(mesh: str, batch: int, layers: int, time_limit: float) -> dict:
    started = time.perf_counter()
    request = PlanRequest(
        model="llama3-8b", mesh=mesh, batch=batch, seq=8192, layers=layers, time_limit=time_limit
    )
    plan = plan_model(request).plan
    timings = plan["timings"]
    gap = plan["solver"]["gap"]
    return {
        "mesh": mesh,
        "layers": layers,
        "batch": batch,
        "capture s": round(timings["capture"], 2),
        "build s": round(timings["build"], 2),
        "solve s": round(timings["solve"], 2),
        "total s": round(time.perf_counter() - started, 2),
        "variables": plan["solver"]["variables"],
        "status": plan["solver"]["status"],
        "gap": "-" if gap is None else f"{100 * gap:.2f}%",
        "peak GiB": round(plan["predicted"]["peak_memory_bytes"] / 2**30, 2),
        "step ms": round(plan["predicted"]["step_time_s"] * 1e3, 2),
        "RSS GiB": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--configs", default="8x8,64,4x4x4,layers", help="comma list of " + ", ".join(CONFIGS)
    )
    parser.add_argument("--time-limit", type=float, default=120.0, help="solver seconds per configuration")
    parser.add_argument("--json", action="store_true", help="print JSON rows instead of a table")
    args = parser.parse_args()
    rows = []
    print("| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS), flush=True)
    for name in args.configs.split(","):
        for mesh, batch, layers in CONFIGS[name]:
            row = run(mesh, batch, layers, args.time_limit)
            rows.append(row)
            if not args.json:
                print(
                    "| "
                    + " | ".join(f"{row[c]:,}" if isinstance(row[c], int) else str(row[c]) for c in COLUMNS)
                    + " |",
                    flush=True,
                )
    if args.json:
        print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
