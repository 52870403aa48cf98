"""Graph documents: size and time of export and load, and planning from a document against from the module.

    python benchmarks/graph_documents.py [--time-limit 60]

For ``mlp`` on a mesh of 4 and ``llama3-8b`` (batch 8, sequence 1024, captured as 4 of its 32 layers) on
8x8, each in a fresh process's warm state (the first plan of a process pays imports and caches, so each
model is planned once before it is timed): the document's size in bytes, the seconds to export it (capture
and write the JSON text) and to load it (parse, validate, rebuild on fake tensors), and the wall time of
``plan_model`` from the module and from the document, with a check that both give the same plan.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from strategies.graph.export import graph_json
from strategies.graph.imported import load_graph, read_graph
from strategies.plan.planner import PlanRequest, export_request_graph, plan_model

CASES = {"mlp": "4", "llama3-8b": "8x8"}
SAME = ("parameters", "inputs", "nodes", "predicted")


def measure(model: str, mesh: str, time_limit: float) -> dict[str, object]:
    settings = {"mesh": mesh, "time_limit": time_limit}
    plan_model(PlanRequest(model=model, **settings))  # warm: imports, strategy caches
    started = time.perf_counter()
    text = graph_json(export_request_graph(PlanRequest(model=model, **settings)))
    export_s = time.perf_counter() - started
    started = time.perf_counter()
    load_graph(read_graph(text))
    load_s = time.perf_counter() - started
    started = time.perf_counter()
    from_module = plan_model(PlanRequest(model=model, **settings)).plan
    module_s = time.perf_counter() - started
    started = time.perf_counter()
    from_graph = plan_model(PlanRequest(model="", graph=read_graph(text), **settings)).plan
    graph_s = time.perf_counter() - started
    same = all(from_module[k] == from_graph[k] for k in SAME)
    return {
        "model": model,
        "mesh": mesh,
        "nodes": text.count('"name":'),
        "bytes": len(text),
        "export_s": export_s,
        "load_s": load_s,
        "plan_module_s": module_s,
        "plan_graph_s": graph_s,
        "same_plan": same,
        "solver": from_graph["solver"]["status"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=60.0)
    args = parser.parse_args()
    print("| model | mesh | bytes | export s | load s | plan from module s | plan from graph s | same plan |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for model, mesh in CASES.items():
        r = measure(model, mesh, args.time_limit)
        print(
            f"| {r['model']} | {r['mesh']} | {r['bytes']:,} | {r['export_s']:.2f} | {r['load_s']:.2f} "
            f"| {r['plan_module_s']:.2f} | {r['plan_graph_s']:.2f} | {r['same_plan']} ({r['solver']}) |"
        )


if __name__ == "__main__":
    main()
