"""A plan made from a short capture names every op of the full graph once expanded: each layer takes the
placements of the captured layer standing for it (no process group needed)."""

from __future__ import annotations

import operator

import pytest

from runtime.full_depth import expand_plan
from runtime.plan_checks import PlanMismatch, node_plans
from strategies.plan.planner import PlanRequest, capture_request, plan_model
from tests.runtime.test_planned_step import LLAMA


@pytest.fixture(scope="module")
def deep() -> tuple[dict, PlanRequest]:
    request = PlanRequest(
        model="llama3-8b", mesh="2x2", batch=4, seq=16, layers=6, dtype="float32", options=LLAMA,
        baseline="fsdp_tp",
    )  # fmt: skip
    return plan_model(request).plan, request


def test_every_op_of_the_full_graph_takes_its_captured_layers_placements(deep) -> None:
    plan, request = deep
    short, _ = capture_request(request, 4)
    full, _ = capture_request(request, 6)
    expanded = expand_plan(plan, short, full)
    assert "layers" not in expanded and len(expanded["nodes"]) > len(plan["nodes"])
    plans = node_plans(expanded, full)  # every op node of the full graph is named, with its own op
    by_name = {entry["name"]: entry for entry in plan["nodes"]}
    left_out = [n for n in ops(full) if path_of(full, n).startswith(("layers.3.", "layers.4."))]
    assert left_out and all(n.name in plans for n in left_out)  # the middle layers the capture left out
    # the last layer of the full stack is the last captured layer: same ops, same placements
    last_full = [n for n in ops(full) if path_of(full, n).startswith("layers.5.")]
    last_short = [n for n in ops(short) if path_of(short, n).startswith("layers.3.")]
    assert len(last_full) == len(last_short)
    expanded_by_name = {entry["name"]: entry for entry in expanded["nodes"]}
    for a, b in zip(last_full, last_short, strict=True):
        assert str(a.target) == str(b.target)
        assert expanded_by_name[a.name]["inputs"] == by_name[b.name]["inputs"]
        assert expanded_by_name[a.name]["output"] == by_name[b.name]["output"]


def ops(graph) -> list:
    """Op nodes the plan names (``getitem`` is folded into its producer)."""
    return [n for n in graph.order if n.target is not operator.getitem]


def path_of(graph, node) -> str:
    return graph.module_path.get(node.name) or ""


def test_a_short_capture_of_another_depth_is_refused(deep) -> None:
    plan, request = deep
    other, _ = capture_request(request, 5)
    full, _ = capture_request(request, 6)
    with pytest.raises(PlanMismatch, match="has no counterpart in the plan's 4-layer capture"):
        expand_plan(plan, other, full)
