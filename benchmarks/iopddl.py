"""Solve the public IOPDDL contest instances at their contest time limits on each backend; print a table.

    python benchmarks/iopddl.py [--instances A,G,M,S] [--backends cbc,highs,cpsat,auto] [--threads 2]
                                [--time-scale 1.0] [--data DIR] [--out results/iopddl.json]
    python benchmarks/iopddl.py --against WINNER_BINARY [--instances A,...,Y] [--time-limit 60] [--threads 2]
                                [--data DIR] [--out results/iopddl-vs-winner.json]

Reference costs are the best final results of the ASPLOS 2025 contest (8 cores, same limits). Instance G is
bundled (`benchmarks/data/iopddl`); A, M and S are read from `--data DIR`, else `$AUTOSHARD_IOPDDL_DATA`
(nothing outside the repository is read unless named). The public instances are published in the
google/iopddl repository.

`--against` (or `$AUTOSHARD_IOPDDL_WINNER`) runs the side-by-side mode (`benchmarks/iopddl_winner.py`): on
each instance (default all 25, A to Y; those not found are rows that say so), `autoshard solve --backend
auto` in a fresh process, then the contest winner's binary, with the same time limit and threads; both costs
recomputed by `solver.evaluate`, the ratio autoshard / winner and its geometric mean.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import iopddl_winner
from solver import iopddl
from solver.errors import InfeasibleError
from solver.solve import SolveOptions, solve, warm_up_kernels

BUNDLED = Path(__file__).resolve().parent / "data" / "iopddl"
DATA_VARIABLE = "AUTOSHARD_IOPDDL_DATA"
#: instance -> (contest time limit in seconds, reference cost)
INSTANCES = {
    "A": (60.0, 6_548_641_531),
    "G": (120.0, 217_039),
    "M": (180.0, 49_928_460_991),
    "S": (240.0, 1_534_613_444),
}
#: Every public contest instance (the side-by-side mode; the table above has limits and references).
ALL_INSTANCES = tuple("ABCDEFGHIJKLMNOPQRSTUVWXY")
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
    variable), the bundled directory."""
    named = named or (Path(os.environ[DATA_VARIABLE]) if os.environ.get(DATA_VARIABLE) else None)
    return [*([named] if named is not None else []), BUNDLED]


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
        result = solve(problem, SolveOptions(backend=backend, time_limit=limit * time_scale, threads=threads))
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
    parser.add_argument("--instances", default=None, help="default A,G,M,S; with --against every one, A..Y")
    parser.add_argument("--backends", default="cbc,highs,cpsat,auto")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--time-scale", type=float, default=1.0, help="multiply every contest limit")
    parser.add_argument(
        "--data", type=Path, default=None, help=f"directory of the instances (default ${DATA_VARIABLE})"
    )
    parser.add_argument(
        "--against",
        type=Path,
        default=os.environ.get(iopddl_winner.WINNER_VARIABLE) or None,
        help=f"the contest winner's binary: side by side (default ${iopddl_winner.WINNER_VARIABLE})",
    )
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds for each, with --against")
    parser.add_argument("--out", type=Path, default=None, help="default results/iopddl[-vs-winner].json")
    args = parser.parse_args()
    if args.against is not None:
        rows = _against(args)
        out, text = args.out or Path("results/iopddl-vs-winner.json"), iopddl_winner.table(rows)
    else:
        rows = _backends(args)
        out, text = args.out or Path("results/iopddl.json"), table(rows)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=1))
    print(text)


def _named(instances: str | None, default: tuple[str, ...], known: tuple[str, ...]) -> list[str]:
    names = instances.split(",") if instances else list(default)
    unknown = [name for name in names if name not in known]
    if unknown:
        sys.exit(f"iopddl: --instances: unknown {', '.join(unknown)}; choose from {', '.join(known)}")
    return names


def _backends(args: argparse.Namespace) -> list[dict]:
    """Each instance at its contest limit on each backend, in this process."""
    instances = _named(args.instances, tuple(INSTANCES), tuple(INSTANCES))
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
    return rows


def _against(args: argparse.Namespace) -> list[dict]:
    """Each instance: autoshard, then the winner's binary, same limit and threads (instances not found are
    rows that say where they were looked for)."""
    if not os.access(args.against, os.X_OK):
        sys.exit(f"iopddl: --against: {args.against} is not an executable (the contest winner's binary)")
    instances = _named(args.instances, ALL_INSTANCES, ALL_INSTANCES)
    dirs = data_dirs(args.data)
    paths, missing = find_instances(instances, dirs)
    rows = []
    for instance in instances:
        if instance in missing:
            rows.append(iopddl_winner.missing_row(instance, f"not found in {', '.join(map(str, dirs))}"))
        else:
            print(
                f"... {instance}: autoshard, then the winner, {args.time_limit:g} s",
                file=sys.stderr,
                flush=True,
            )
            problem = iopddl.load(paths[instance])
            rows.append(
                iopddl_winner.side_by_side(
                    instance, paths[instance], problem, args.against, args.time_limit, args.threads
                )
            )
        print(iopddl_winner.table(rows[-1:]).splitlines()[2], file=sys.stderr, flush=True)
    return rows


if __name__ == "__main__":
    main()
