"""Before/after outputs of a refactor: plans of known settings and IOPDDL costs, written as one JSON; compare
two such files and print every difference.

    python benchmarks/same_outputs.py --plans OUT.json                 # the plans below, times left out
    python benchmarks/same_outputs.py --iopddl OUT.json [--instances B,G,V,M] [--time-limit 60] [--data DIR]
    python benchmarks/same_outputs.py --compare BEFORE.json AFTER.json

Run it once on the commit before a change and once after (with that checkout first on ``PYTHONPATH``); an
empty comparison says the change left every plan (nodes, placements, parameters, predicted figures, solver
status, objective and bound) and every IOPDDL cost as it was. What a run measures of itself (seconds) is left
out. A time-limited solve (the IOPDDL instances, any plan stopped by its limit) may end elsewhere on a busy
machine: run the "before" twice to see that noise before reading a difference as the change's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

# the checkout on PYTHONPATH (the one before or after the change), else this one; never this folder, whose
# benchmarks/strategies.py would hide the package
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
if os.environ.get("PYTHONPATH") is None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: name -> PlanRequest fields: the known answers of tests/strategies/plan, the README's plan, a recomputed
#: one-node run, a pipeline and a hand-written baseline
PLANS: dict[str, dict[str, Any]] = {
    "known-2d llama3-8b 1 layer 8x8 b16 s2048": {
        "model": "llama3-8b", "mesh": "8x8", "axis_names": "dp,tp", "batch": 16, "seq": 2048, "layers": 1,
        "time_limit": 600.0, "gap": 0.0,
    },
    "mlp 4": {"model": "mlp", "mesh": "4", "time_limit": 60.0, "gap": 0.0},
    "mlp 4 b65536 1 GiB": {
        "model": "mlp", "mesh": "4", "batch": 65536, "memory_gib": 1.0, "time_limit": 60.0,
    },
    "mlp 4 ddp": {"model": "mlp", "mesh": "4", "batch": 65536, "baseline": "ddp"},
    "gpt2-small 2x2": {"model": "gpt2-small", "mesh": "2x2", "batch": 8, "seq": 256},
    "llama3-8b 8x8": {"model": "llama3-8b", "mesh": "8x8"},
    "llama3-8b 8x8 b16 s8192": {"model": "llama3-8b", "mesh": "8x8", "batch": 16, "seq": 8192},
    "llama3-8b 8 b16 s8192 recomputed": {"model": "llama3-8b", "mesh": "8", "batch": 16, "seq": 8192},
    "llama3-8b pp,dp,tp 2x4x8 b64 s8192": {
        "model": "llama3-8b", "mesh": "2x4x8", "axis_names": "pp,dp,tp", "batch": 64, "seq": 8192,
    },
}  # fmt: skip
MEASURED = {"seconds", "timings", "wall_s"}
"""Keys whose values are what a run took, not what it answered."""


def _without_measured(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_measured(v) for k, v in value.items() if k not in MEASURED}
    if isinstance(value, list):
        return [_without_measured(v) for v in value]
    return value


def plans() -> dict[str, Any]:
    from strategies.plan.planner import PlanRequest, plan_model

    answers: dict[str, Any] = {}
    for name, fields in PLANS.items():
        started = time.perf_counter()
        try:
            answers[name] = _without_measured(plan_model(PlanRequest(**fields)).plan)
        except Exception as error:  # an error is an answer too: the same error before and after
            answers[name] = {"error": f"{type(error).__name__}: {error}"}
        print(f"{name}: {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return answers


def iopddl_costs(instances: list[str], time_limit: float, data: Path | None) -> dict[str, Any]:
    from benchmarks.iopddl import data_dirs, find_instances
    from solver import iopddl
    from solver.solve import solve, warm_up_kernels

    warm_up_kernels()
    found, missing = find_instances(instances, data_dirs(data))
    answers: dict[str, Any] = {name: {"error": "not found"} for name in missing}
    for name, path in found.items():
        started = time.perf_counter()
        answer = _solve_within(solve, iopddl.load(path), time_limit).to_dict()
        answers[name] = _without_measured({k: v for k, v in answer.items() if k != "first_solution_seconds"})
        print(
            f"{name}: {answer['status']} {answer['cost']} in {time.perf_counter() - started:.1f} s",
            file=sys.stderr,
        )
    return answers


def _solve_within(solve: Any, problem: Any, time_limit: float) -> Any:
    """``solve`` within ``time_limit``, whether it takes its options as an object (since issue 29) or not."""
    try:
        from solver.solve import SolveOptions
    except ImportError:
        return solve(problem, time_limit=time_limit)
    return solve(problem, SolveOptions(time_limit=time_limit))


def differences(before: Any, after: Any, path: str = "") -> list[str]:
    if isinstance(before, dict) and isinstance(after, dict):
        found = [f"{path}.{k}: only before" for k in before.keys() - after.keys()]
        found += [f"{path}.{k}: only after" for k in after.keys() - before.keys()]
        for key in before.keys() & after.keys():
            found += differences(before[key], after[key], f"{path}.{key}")
        return found
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        return [
            line
            for i, (b, a) in enumerate(zip(before, after, strict=True))
            for line in differences(b, a, f"{path}[{i}]")
        ]
    return [] if before == after else [f"{path}: {json.dumps(before)[:200]} -> {json.dumps(after)[:200]}"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plans", type=Path, help="write the plans here")
    parser.add_argument("--iopddl", type=Path, help="write the IOPDDL costs here")
    parser.add_argument("--instances", default="B,G,V,M")
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--data", type=Path, default=None)
    parser.add_argument("--compare", type=Path, nargs=2, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args()
    if args.compare:
        before, after = (json.loads(path.read_text()) for path in args.compare)
        found = differences(before, after)
        print("\n".join(found) if found else f"identical: {len(before)} answers")
        return 1 if found else 0
    if args.plans:
        args.plans.write_text(json.dumps(plans(), indent=1, sort_keys=True))
    if args.iopddl:
        names = [name.strip() for name in args.instances.split(",")]
        args.iopddl.write_text(json.dumps(iopddl_costs(names, args.time_limit, args.data), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
