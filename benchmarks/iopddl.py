"""Solve the public IOPDDL contest instances at their contest time limits on each backend; print a table.

    python benchmarks/iopddl.py [--instances A,G,M,S] [--backends cbc,highs,cpsat,auto] [--threads 2]
                                [--time-scale 1.0] [--data DIR] [--out results/iopddl.json]

Reference costs are the best final results of the ASPLOS 2025 contest (8 cores, same limits). Instance G is
bundled (`benchmarks/data/iopddl`); A, M and S are read from `--data DIR`, else `$AUTOSHARD_IOPDDL_DATA`,
else `../shared/benchmarks/iopddl` beside the clone when it exists. The public instances are published in
the google/iopddl repository.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from solver import iopddl
from solver.errors import InfeasibleError
from solver.solve import solve, warm_up_kernels

BUNDLED = Path(__file__).resolve().parent / "data" / "iopddl"
TEAM_DATA = Path(__file__).resolve().parents[2] / "shared" / "benchmarks" / "iopddl"
DATA_VARIABLE = "AUTOSHARD_IOPDDL_DATA"
#: instance -> (contest time limit in seconds, reference cost)
INSTANCES = {
    "A": (60.0, 6_548_641_531),
    "G": (120.0, 217_039),
    "M": (180.0, 49_928_460_991),
    "S": (240.0, 1_534_613_444),
}
COLUMNS = (
    "instance",
    "nodes",
    "edges",
    "strategies",
    "after reductions",
    "backend",
    "status",
    "cost",
    "bound",
    "gap",
    "seconds",
    "first sol. s",
    "x reference",
)


def instance_file(instance: str) -> str:
    return f"asplos-2025-iopddl-{instance}.json.gz"


def data_dirs(named: Path | None) -> list[Path]:
    """Where instances are looked for, in order: the named directory (``--data``, else the environment
    variable), ``../shared/benchmarks/iopddl`` when it exists, the bundled directory."""
    named = named or (Path(os.environ[DATA_VARIABLE]) if os.environ.get(DATA_VARIABLE) else None)
    dirs = [named] if named is not None else ([TEAM_DATA] if TEAM_DATA.is_dir() else [])
    return [*dirs, BUNDLED]


def find_instances(instances: list[str], dirs: list[Path]) -> tuple[dict[str, Path], list[str]]:
    """(instance -> its file, the instances found nowhere)."""
    found, missing = {}, []
    for instance in instances:
        paths = [d / instance_file(instance) for d in dirs if (d / instance_file(instance)).is_file()]
        if paths:
            found[instance] = paths[0]
        else:
            missing.append(instance)
    return found, missing


def run(path: Path, instance: str, backend: str, threads: int, time_scale: float) -> dict:
    limit, reference = INSTANCES[instance]
    problem = iopddl.load(path)
    started = time.perf_counter()
    try:
        result = solve(problem, backend=backend, time_limit=limit * time_scale, threads=threads)
    except InfeasibleError as error:
        return {"instance": instance, "backend": backend, "status": "infeasible", "message": str(error)}
    row = result.to_dict()
    row.pop("solution")
    row.update(
        instance=instance,
        requested_backend=backend,
        wall=time.perf_counter() - started,
        reference=reference,
        limit=limit * time_scale,
    )
    row["ratio"] = result.cost / reference if result.cost is not None else None
    return row


def table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in rows:
        size = row.get("size", {})
        cells = [
            row["instance"],
            f"{size.get('nodes', 0):,}",
            f"{size.get('edges', 0):,}",
            f"{size.get('strategies', 0):,}",
            f"{size.get('free_super_strategies', 0):,}",
            _backend_label(row),
            row["status"],
            f"{row['cost']:,.0f}" if row.get("cost") is not None else "-",
            f"{row['bound']:,.0f}" if row.get("bound") is not None else "-",
            f"{100 * row['gap']:.2f}%" if row.get("gap") is not None else "-",
            f"{row.get('wall', 0):.1f}",
            f"{row['first_solution_seconds']:.2f}" if row.get("first_solution_seconds") is not None else "-",
            f"{row['ratio']:.5f}x" if row.get("ratio") is not None else "-",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _backend_label(row: dict) -> str:
    """`cbc`, `cbc (lns)`, or `auto -> highs (lns)`: what was asked for and what ran."""
    requested, ran = row.get("requested_backend", row["backend"]), row["backend"]
    return ran if ran.startswith(requested) else f"{requested} -> {ran}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--instances", default="A,G,M,S")
    parser.add_argument("--backends", default="cbc,highs,cpsat,auto")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--time-scale", type=float, default=1.0, help="multiply every contest limit")
    parser.add_argument(
        "--data", type=Path, default=None, help=f"directory of the instances (default ${DATA_VARIABLE})"
    )
    parser.add_argument("--out", type=Path, default=Path("results/iopddl.json"))
    args = parser.parse_args()
    instances = args.instances.split(",")
    unknown = [name for name in instances if name not in INSTANCES]
    if unknown:
        sys.exit(f"iopddl: --instances: unknown {', '.join(unknown)}; choose from {', '.join(INSTANCES)}")
    dirs = data_dirs(args.data)
    paths, missing = find_instances(instances, dirs)
    if missing:
        sys.exit(
            f"iopddl: instance {', '.join(missing)} not found in {', '.join(str(d) for d in dirs)}: "
            f"name the directory of the public instances (google/iopddl on GitHub) with --data DIR "
            f"or ${DATA_VARIABLE}, or run --instances G (bundled)"
        )
    warm_up_kernels()
    rows = []
    for instance in instances:
        for backend in args.backends.split(","):
            print(f"... {instance} on {backend}", file=sys.stderr, flush=True)
            rows.append(run(paths[instance], instance, backend, args.threads, args.time_scale))
            print(table(rows[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1))
    print(table(rows))


if __name__ == "__main__":
    main()
