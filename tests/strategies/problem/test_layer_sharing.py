"""Repeated transformer layers share decisions; the program barely grows with depth."""

from __future__ import annotations

import re

from strategies.plan.planner import PlanRequest, plan_model
from strategies.problem.layer_sharing import layer_of, merge_groups

SMALL_LLAMA = {"dim": 256, "n_heads": 8, "n_kv_heads": 4, "ffn_dim": 512, "vocab_size": 512}


def _plan(layers: int) -> dict:
    request = PlanRequest(
        model="llama3-8b", mesh="2x2", batch=4, seq=256, layers=layers, time_limit=60, options=SMALL_LLAMA
    )
    return plan_model(request).plan


def test_layer_paths_and_group_merging() -> None:
    assert layer_of("layers.12.attention.wq") == 12 and layer_of("model.layers.3") == 3
    assert layer_of("tok_embeddings") is None and layer_of("players.1") is None
    assert sorted(merge_groups([[1, 2], [2, 3], [7, 8], [9]])) == [(1, 2, 3), (7, 8)]


def test_middle_layers_take_the_same_placements_and_the_program_stays_flat() -> None:
    plans = {n: _plan(n) for n in (4, 8)}
    plan = plans[8]
    by_layer: dict[int, dict[str, list[str]]] = {}
    for name, spec in plan["parameters"].items():
        match = re.match(r"layers\.(\d+)\.(.*)", name)
        if match:
            by_layer.setdefault(int(match.group(1)), {})[match.group(2)] = spec
    middle = [by_layer[i] for i in range(1, 7)]
    assert all(layer == middle[0] for layer in middle)  # layers 1..6 tied; 0 and 7 free
    # Doubling the depth adds far fewer variables than doubling the program would.
    v4, v8 = (plans[n]["solver"]["variables"] for n in (4, 8))
    assert v8 < 1.25 * v4
