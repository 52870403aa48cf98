"""Graph documents of the test models, exported once per test session (each export captures a step)."""

from __future__ import annotations

import copy
import functools
from typing import Any

from strategies.graph.export import graph_json
from strategies.plan.planner import PlanRequest, export_request_graph

SMALL_LLAMA = {"dim": 256, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 512, "ffn_dim": 768}
"""A Llama 3 shape small enough to plan in a second; 7 layers deep, captured as 4 (a layer repeat)."""

REQUESTS: dict[str, dict[str, Any]] = {
    "mlp": {"model": "mlp", "mesh": "4", "batch": 64},
    "gpt2": {"model": "gpt2-small", "mesh": "2x2", "layers": 2, "batch": 4, "seq": 64},
    "llama": {
        "model": "llama3-8b",
        "mesh": "4",  # proven optimal in ~1 s (on 2x2: ~15 s per plan, twice)
        "layers": 7,
        "batch": 4,
        "seq": 32,
        "options": SMALL_LLAMA,
    },
}
"""Module requests by short name: an MLP, a 2-layer GPT with attention, a deep Llama captured short."""

SOLVE = {"time_limit": 60.0, "gap": 0.0}


def module_request(name: str) -> PlanRequest:
    return PlanRequest(**copy.deepcopy(REQUESTS[name]), **SOLVE)


def graph_request(name: str, document: dict[str, Any]) -> PlanRequest:
    """The module request's mesh and solver settings, planning ``document`` instead of the model."""
    return PlanRequest(model="", mesh=REQUESTS[name]["mesh"], graph=document, **SOLVE)


@functools.cache
def exported_text(name: str) -> str:
    """The JSON text ``autoshard export-graph`` writes for the request ``name``."""
    return graph_json(export_request_graph(module_request(name)))
