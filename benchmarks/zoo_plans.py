"""Plans of the zoo's architectures as a user meets them: `autoshard plan` in a fresh process, its wall time.

    python benchmarks/zoo_plans.py [--repeats 3] [--only gpt2,t5] [--budgets half]

For each tiny `transformers` architecture of ``tests/strategies/models/user_models/zoo.py`` on a 2x2 (dp, tp)
mesh: the replicated peak (the ``ddp`` layout's plan, once), then ``--repeats`` runs each of the unconstrained
plan and the plan under half the replicated peak, every one a fresh `autoshard plan` process with the default
solver settings (60 s limit, 1% gap). Prints per architecture and budget the median wall time (imports,
capture, build and solve, as the user waits for it), the median capture time (building the model, its imports
included, and tracing its step) and solve time, the largest gap the plans' certificates proved, and every
run's wall time. The issue-24 target: every half-memory plan <= 10 s wall.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.strategies.models.user_models.zoo import ARCHITECTURES  # noqa: E402

ZOO = ROOT / "tests" / "strategies" / "models" / "user_models" / "zoo.py"


def plan(architecture: str, out: Path, *options: str) -> tuple[float, dict]:
    """Wall seconds of one `autoshard plan` process and the plan it wrote."""
    command = [
        sys.executable,
        "-m",
        "service.cli",
        "plan",
        "--model",
        f"{ZOO}:{architecture}",
        "--mesh",
        "2x2",
        "--axis-names",
        "dp,tp",
        "--out",
        str(out),
        "-q",
        *options,
    ]
    started = time.perf_counter()
    subprocess.run(command, cwd=ROOT, check=True, capture_output=True)
    return time.perf_counter() - started, json.loads(out.read_text(encoding="utf-8"))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", default="", help="comma-separated architectures (default: all)")
    parser.add_argument(
        "--budgets", default="unconstrained,half", help="comma-separated: unconstrained, half (default: both)"
    )
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n] or list(ARCHITECTURES)
    budgets = [b for b in args.budgets.split(",") if b]
    if unknown := set(budgets) - {"unconstrained", "half"}:
        parser.error(f"--budgets: unknown {sorted(unknown)}")
    header = f"{'architecture':24} {'budget':14} {'wall s':>7} {'capture s':>9} {'solve s':>8} {'gap %':>6}"
    print(f"{header}  runs")
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "plan.json"
        for name in names:
            _, replicated = plan(name, out, "--baseline", "ddp")
            half_gib = replicated["predicted"]["peak_memory_bytes"] / 2 / 2**30
            options_by_budget = {"unconstrained": (), "half": ("--memory-gib", f"{half_gib:.9f}")}
            for budget in budgets:
                options = options_by_budget[budget]
                walls, captures, solves, gaps = [], [], [], []
                for _ in range(args.repeats):
                    wall, result = plan(name, out, *options)
                    walls.append(wall)
                    captures.append(result["timings"]["capture"])
                    solves.append(result["timings"]["solve"])
                    gaps.append(result["solver"]["gap"] or 0.0)
                medians = (statistics.median(v) for v in (walls, captures, solves))
                row = "{:7.1f} {:9.2f} {:8.2f}".format(*medians)
                runs = "/".join(f"{w:.1f}" for w in walls)
                print(f"{name:24} {budget:14} {row} {100 * max(gaps):6.2f}  {runs}", flush=True)


if __name__ == "__main__":
    main()
