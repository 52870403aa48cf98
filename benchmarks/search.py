"""Plan search benchmark: llama3-8b on 64 h100 devices, every 1-, 2- and 3-D mesh, batches 16, 32, 64.

    python benchmarks/search.py [--workers N] [--time-limit S] [--budget S] [--gap G] [--top 10] [--out DIR]

Runs the search as a user runs it, ``autoshard search --model llama3-8b --devices 64 --batch-sizes
16,32,64 --seq 8192 ...`` in a fresh process, and times it from start to exit ("wall s"). Then, from the
results and the plans it wrote: how many candidates ended in each status, the certificate of each (status
and gap, never hidden), and where the time went: the seconds of every candidate summed (its problem build
and solve, from the plan's timings) by mesh rank, against what the workers could give in the wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
COMMAND = ["--model", "llama3-8b", "--devices", "64", "--batch-sizes", "16,32,64", "--seq", "8192"]


def flags(args: argparse.Namespace) -> list[str]:
    """The command's options beyond the model's: the CLI's defaults unless the benchmark was given others."""
    given = [("--workers", args.workers), ("--time-limit", args.time_limit), ("--budget", args.budget)]
    return [text for option, value in given if value is not None for text in (option, f"{value:g}")]


def run(args: argparse.Namespace, out: Path) -> tuple[float, dict[str, Any]]:
    autoshard = Path(sys.executable).with_name("autoshard")
    argv = [str(autoshard), "search", *COMMAND, *flags(args), "--gap", str(args.gap)]
    argv += ["--out", str(out), "--quiet"]
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("RAY_ADDRESS", "AUTOSHARD_DATABASE_URL")
    }
    started = time.perf_counter()
    subprocess.run(argv, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started, json.loads((out / "results.json").read_text())


def time_split(results: dict[str, Any], out: Path) -> dict[str, dict[str, float]]:
    """Per mesh rank (1-D, 2-D, 3-D): candidates, the seconds of their build, solve and all, and the longest
    solve (against the time limit: the solver shares it among its phases after the reductions)."""
    split: dict[str, dict[str, float]] = {}
    for row in results["candidates"]:
        part = split.setdefault(
            f"{len(row['mesh'])}-D",
            {"candidates": 0, "build_s": 0.0, "solve_s": 0.0, "solve_max_s": 0.0, "all_s": 0.0},
        )
        part["candidates"] += 1
        part["all_s"] += row["seconds"]
        if row["plan_file"]:
            timings = json.loads((out / row["plan_file"]).read_text())["timings"]
            part["build_s"] += timings.get("build", 0.0)
            part["solve_s"] += timings.get("solve", 0.0)
            part["solve_max_s"] = max(part["solve_max_s"], timings.get("solve", 0.0))
    return split


def markdown(
    wall: float,
    results: dict[str, Any],
    split: dict[str, dict[str, float]],
    args: argparse.Namespace,
    top: int,
) -> str:
    rows = results["candidates"]
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    gaps = [
        row["certificate"]["gap"]
        for row in rows
        if row["certificate"] and row["certificate"]["gap"] is not None
    ]
    request = results["request"]
    budget = f"budget {request['budget_s']:g} s, " if request.get("budget_s") else ""
    limits = sorted(row["time_limit_s"] for row in rows if row.get("time_limit_s") is not None)
    given = (
        f"{limits[0]:g}-{limits[-1]:g} s (median {median(limits):g} s)"
        if limits and limits[0] != limits[-1]
        else f"{request['time_limit_s']:g} s"
    )
    options = " ".join([*flags(args), "--gap", f"{args.gap:g}"])
    lines = [
        f"`autoshard search` llama3-8b, 64 x h100, {len(rows)} candidates, {options} ({budget}"
        f"solver limits {given}, {request['workers']} workers): **{wall:.1f} s** wall "
        f"(start to exit; {results['wall_s']:.1f} s inside the search); "
        + ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
        + (f"; gap median {median(gaps):.2%}, largest {max(gaps):.2%}" if gaps else ""),
        "",
        "| rank | id | mesh | axes | batch | step s | tokens/s | peak GiB | compute s | exposed comm s "
        "| status | gap |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows[:top]:
        if row["rank"] is None:
            break
        mesh, axes = "x".join(map(str, row["mesh"])), ",".join(row["axis_names"])
        lines.append(
            f"| {row['rank']} | {row['id']} | {mesh} | {axes} "
            f"| {row['batch']} | {row['step_time_s']:.4f} | {row['tokens_per_s']:,.0f} "
            f"| {row['peak_memory_bytes'] / 2**30:.1f} | {row['compute_s']:.4f} "
            f"| {row['exposed_comm_s']:.4f} "
            f"| {row['status']} | {row['certificate']['gap']:.2%} |"
        )
    lines += [
        "",
        "| meshes | candidates | build s (sum) | solve s (sum) | solve s (longest) | candidate s (sum) |",
        "|---|---|---|---|---|---|",
    ]
    for name, part in sorted(split.items()):
        lines.append(
            f"| {name} | {part['candidates']:.0f} | {part['build_s']:.1f} | {part['solve_s']:.1f} "
            f"| {part['solve_max_s']:.1f} | {part['all_s']:.1f} |"
        )
    total = sum(part["all_s"] for part in split.values())
    workers = request["workers"]
    lines.append(f"| all | {len(rows)} | | | | {total:.1f} (of {wall * workers:.1f} worker-seconds) |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=None, help="default: the CLI's (the cores)")
    parser.add_argument("--time-limit", type=float, default=None, help="default: the CLI's (60 s at most)")
    parser.add_argument("--budget", type=float, default=None, help="default: the CLI's (60 s)")
    parser.add_argument("--gap", type=float, default=0.01)
    parser.add_argument("--top", type=int, default=10)
    parser.add_argument(
        "--out", type=Path, default=None, help="keep the results here (default: a temp folder)"
    )
    parser.add_argument("--json", action="store_true", help="print the results document too")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as temp:
        out = args.out or Path(temp) / "search"
        wall, results = run(args, out)
        print(markdown(wall, results, time_split(results, out), args, args.top))
        if args.json:
            print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
