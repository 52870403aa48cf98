"""Time strategy generation for the joint forward + backward graph of Llama 3 transformer layers.

    python benchmarks/strategies.py [--model llama3-8b] [--layers 1] [--mesh 8x8] [--hardware h100]
                                    [--batch 16] [--seq 8192] [--no-edges] [--json]

Builds the layers on the meta device (bf16, global shapes), captures one training step with
``strategies.graph.capture.capture_joint`` (fake tensors), then, for every ``call_function`` node, calls
``op_strategies`` with the node's argument shapes: once with empty caches (cold) and once more (warm).
It also builds every edge's cost matrix (producer strategies x consumer strategies, our vectorised
redistribution model), which is what a problem builder needs next. Prints one table row, and the ops
that came from PyTorch's rules or replicate-only fallbacks.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from torch import nn

from strategies.cost.comm import clear_cache as clear_cost_cache
from strategies.cost.mesh import Mesh, make_mesh
from strategies.graph.capture import OpCall, capture_joint, op_calls
from strategies.models.llama import TransformerBlock, llama_config
from strategies.ops.generate import OpStrategies, clear_cache, op_strategies
from strategies.ops.registry import registered_ops


class Layers(nn.Module):
    """``n`` Llama transformer blocks in a row, taking the residual stream and the RoPE tables."""

    def __init__(self, model: str, n: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(TransformerBlock(llama_config(model)) for _ in range(n))

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x, rope)
        return x


def capture_layers(model: str, layers: int, batch: int, seq: int) -> torch.fx.GraphModule:
    """The joint graph of ``layers`` blocks on a ``[batch, seq, dim]`` bf16 residual stream."""
    config = llama_config(model)
    with torch.device("meta"):
        module = Layers(model, layers).to(torch.bfloat16)
    x = torch.empty(batch, seq, config.dim, dtype=torch.bfloat16, device="meta", requires_grad=True)
    rope = torch.empty(2, seq, config.head_dim, device="meta")
    return capture_joint(module, (x, rope))


def generate(calls: list[OpCall], mesh: Mesh) -> tuple[dict[str, OpStrategies], dict[str, str], float]:
    """Strategies per node name, errors per node name, seconds."""
    results: dict[str, OpStrategies] = {}
    errors: dict[str, str] = {}
    start = time.perf_counter()
    for call in calls:
        try:
            results[call.name] = op_strategies(call.op, call.args, call.kwargs, mesh, outputs=call.outputs)
        except Exception as error:  # a benchmark reports rule bugs instead of stopping at the first
            errors[call.name] = f"{call.op}: {type(error).__name__}: {str(error).splitlines()[0][:200]}"
    return results, errors, time.perf_counter() - start


def edge_matrices(calls: list[OpCall], results: dict[str, OpStrategies]) -> tuple[int, int, float]:
    """Build every producer -> consumer cost matrix; (edges, matrix entries, seconds)."""
    edges = entries = 0
    start = time.perf_counter()
    for call in calls:
        consumer = results.get(call.name)
        if consumer is None:
            continue
        for index, source in enumerate(call.producers):
            producer = results.get(source[0]) if source else None
            if producer is None:
                continue
            matrix = consumer.redistribute_from(index, producer.output_specs[:, source[1], :])
            edges += 1
            entries += matrix.size
    return edges, entries, time.perf_counter() - start


def run(
    model: str, layers: int, mesh_text: str, hardware: str, batch: int, seq: int, edges: bool = True
) -> dict[str, Any]:
    """Capture, generate cold and warm, build edge matrices (unless ``edges`` is false); one result row."""
    registered_ops()  # import the op families now, so "cold" times generation rather than imports
    started = time.perf_counter()
    gm = capture_layers(model, layers, batch, seq)
    capture_s = time.perf_counter() - started
    calls = op_calls(gm)
    mesh = make_mesh(mesh_text, hardware=hardware)
    clear_cache()
    clear_cost_cache()
    results, errors, cold_s = generate(calls, mesh)
    n_edges, entries, edge_cold_s = edge_matrices(calls, results) if edges else (0, 0, float("nan"))
    _, _, warm_s = generate(calls, mesh)
    _, _, edge_warm_s = edge_matrices(calls, results) if edges else (0, 0, float("nan"))
    sources = Counter(r.source for r in results.values())
    fallback = {
        source: sorted({str(r.op) for r in results.values() if r.source == source})
        for source in ("pytorch", "replicate")
    }
    return {
        "model": model,
        "layers": layers,
        "mesh": mesh_text,
        "hardware": hardware,
        "batch x seq": f"{batch}x{seq}",
        "ops": len(calls),
        "op kinds": len({str(c.op) for c in calls}),
        "strategies": sum(len(r) for r in results.values()),
        "capture s": round(capture_s, 2),
        "cold s": round(cold_s, 3),
        "warm s": round(warm_s, 4),
        "ms/op cold": round(1e3 * cold_s / max(len(calls), 1), 3),
        "autoshard": sources.get("autoshard", 0),
        "pytorch": sources.get("pytorch", 0),
        "replicate": sources.get("replicate", 0),
        "errors": len(errors),
        "edges": n_edges,
        "edge entries": entries,
        "edges cold s": round(edge_cold_s, 3),
        "edges warm s": round(edge_warm_s, 3),
        "fallback ops": fallback,
        "error messages": sorted(set(errors.values())),
    }


def table(row: dict[str, Any]) -> str:
    """A one-row markdown table of the scalar figures."""
    keys = [k for k, v in row.items() if not isinstance(v, (list, dict))]
    return "\n".join(
        [
            "| " + " | ".join(keys) + " |",
            "|" + "---|" * len(keys),
            "| " + " | ".join(f"{row[k]:,}" if isinstance(row[k], int) else str(row[k]) for k in keys) + " |",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama3-8b")
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--mesh", default="8x8")
    parser.add_argument("--hardware", default="h100")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--no-edges", action="store_true", help="skip the edge cost matrices")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    a = parser.parse_args()
    row = run(a.model, a.layers, a.mesh, a.hardware, a.batch, a.seq, edges=not a.no_edges)
    if a.json:
        print(json.dumps(row, indent=2))
        return
    print(table(row))
    for source, ops in row["fallback ops"].items():
        print(f"{source}: {', '.join(ops) or '-'}")
    for message in row["error messages"]:
        print(f"error: {message}")


if __name__ == "__main__":
    main()
