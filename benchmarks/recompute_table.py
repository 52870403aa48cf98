"""``--recompute auto`` against the hand policies and layouts: predicted step time and peak per combination.

For each run (a model, mesh and batch), every ``--recompute`` in {none, selective, full, auto} times every
layout in {the solver's own, ddp, fsdp, megatron, fsdp_tp} (the layouts that fit the mesh), planned from one
capture per run (``plan_captured``, as the search does); prints a markdown table per run and, per run, whether
``auto`` (the solver's own layout) is predicted no slower than the best combination that fits. A figure of the
cost model, not of wall time (the planning walls are printed for reference).

    python -m benchmarks.recompute_table                  # the five runs of issue 25
    python -m benchmarks.recompute_table --runs 8b-8x8-16
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from solver.errors import InfeasibleError
from strategies.plan.planner import PlanRequest, _layer_repeat, capture_request, plan_captured

RUNS = {
    "8b-8-16": PlanRequest(model="llama3-8b", mesh="8", axis_names="dp", batch=16, seq=8192),
    "8b-64-128": PlanRequest(model="llama3-8b", mesh="64", axis_names="dp", batch=128, seq=8192),
    "70b-32x8-512": PlanRequest(model="llama3-70b", mesh="32x8", axis_names="dp,tp", batch=512, seq=8192),
    "8b-8x8-16": PlanRequest(model="llama3-8b", mesh="8x8", batch=16, seq=8192),
    "8b-8x8-64": PlanRequest(model="llama3-8b", mesh="8x8", batch=64, seq=8192),
}
POLICIES = ("none", "selective", "full", "auto")
LAYOUTS = (None, "ddp", "fsdp", "megatron", "fsdp_tp")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default=",".join(RUNS), help="comma-separated: " + ", ".join(RUNS))
    parser.add_argument("--time-limit", type=float, default=30.0)
    args = parser.parse_args()
    for name in args.runs.split(","):
        base = replace(RUNS[name], time_limit=args.time_limit)
        repeat = _layer_repeat(base)
        graph, _ = capture_request(base, repeat.captured if repeat is not None else base.layers)
        print(f"\n### {name}: {base.model}, mesh {base.mesh}, batch {base.batch} x {base.seq}\n")
        print("| layout | " + " | ".join(POLICIES) + " |")
        print("|---|" + "---|" * len(POLICIES))
        best: tuple[float, str] | None = None  # the fastest fixed policy, any layout
        auto_own: float | None = None
        for layout in LAYOUTS:
            cells = []
            for policy in POLICIES:
                request = replace(base, recompute=policy, baseline=layout)
                started = time.perf_counter()
                try:
                    plan = plan_captured(request, graph, repeat).plan
                except InfeasibleError as error:
                    cells.append(f"no plan ({str(error).split(':')[-1].strip()})")
                    continue
                except ValueError as error:  # a layout the mesh cannot take
                    cells.append(f"- ({error})"[:60])
                    continue
                step = plan["predicted"]["step_time_s"]
                peak = plan["predicted"]["peak_memory_bytes"] / 2**30
                wall = time.perf_counter() - started
                cells.append(f"{step * 1e3:.1f} ms, {peak:.1f} GiB ({wall:.1f} s)")
                label = f"{layout or 'own'} / {policy}"
                if policy == "auto" and layout is None:
                    auto_own = step
                elif policy != "auto" and (best is None or step < best[0]):
                    best = (step, label)
            print(f"| {layout or 'solver'} | " + " | ".join(cells) + " |")
        if best is not None and auto_own is not None:
            verdict = "no slower" if auto_own <= best[0] * (1 + base.gap) else "SLOWER"
            print(
                f"\nauto: {auto_own * 1e3:.1f} ms; best other: {best[0] * 1e3:.1f} ms ({best[1]}): {verdict} "
                f"(within the {100 * base.gap:g}% gap)"
            )


if __name__ == "__main__":
    main()
