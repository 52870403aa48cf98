"""Activation recomputation in the problem (:mod:`strategies.problem.recompute`).

The memory model against Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
Models", sections 4.1 and 5): a GPT layer keeps ``s*b*h*(34 + 5*a*s/h)`` bytes for its backward,
``34*s*b*h`` with selective recomputation (the softmax, its dropout and the dropout's output made again from
the kept ``Q``, ``K``, ``V``), each divided by ``t`` under ``t``-way tensor + sequence parallelism (here: the
least bytes any placement on ``t`` devices gives each value). The captured dropout's masks take 2 bytes an
element where the paper counts 1, and the problem holds each weight's ``t`` (see
``test_activation_memory``): both are added to the published figures.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import fx

from solver.errors import InfeasibleError
from solver.solve import SolveOptions, solve
from strategies.cost.mesh import make_mesh
from strategies.graph.passes import capture_for_planning
from strategies.problem.builder import BuiltProblem, ProblemOptions, build_problem
from strategies.problem.recompute import RECOMPUTE, Policy, check_policy
from tests.strategies.problem.test_activation_memory import GPT

SEQ, BATCH, HIDDEN, HEADS = 256, 2, 256, 4
MASK_BYTES = 2


def _graph(layers: int):
    model = GPT(layers, HIDDEN, HEADS).to(torch.bfloat16).train()
    tokens = torch.zeros(BATCH, SEQ, dtype=torch.long)
    return capture_for_planning(model, (tokens, tokens), lambda loss: loss)


@pytest.fixture(scope="module")
def graphs() -> dict[int, object]:
    return {layers: _graph(layers) for layers in (1, 2)}


def _build(graph, policy: Policy, mesh_shape=(1,), memory_limit=None) -> BuiltProblem:
    return build_problem(
        graph,
        make_mesh(mesh_shape, ("dp",) if len(mesh_shape) == 1 else ("dp", "tp")),
        ProblemOptions(memory_limit=memory_limit, share_layers=False, recompute=policy),
    )


def korthikanti_selective(graph) -> Policy:
    """The paper's selective set: every op between a layer's ``Q K^T`` (included) and its attention over
    ``V`` that reads from it (scores, softmax, its dropout)."""
    forward = graph.order[: graph.backward_start]
    bmms = [n for n in forward if n.target is torch.ops.aten.bmm.default]
    chosen: set[fx.Node] = set()
    for scores, attention in zip(bmms[::2], bmms[1::2], strict=True):
        chosen.add(scores)
        for node in forward[forward.index(scores) + 1 : forward.index(attention)]:
            if any(arg in chosen for arg in node.all_input_nodes):
                chosen.add(node)
    return lambda node: node in chosen


def kept_bytes(built: BuiltProblem, boundary: int) -> int:
    """The least activation bytes per device held across the forward/backward boundary: each value crossing
    it at the smallest usage any of its strategies has (with a fixed policy every candidate has one mode)."""
    problem = built.problem
    total = 0
    for i, node in enumerate(built.nodes):
        start, end = problem.intervals[i]
        if node.kind in ("op", "kept", "held") and start < boundary < end:  # activations, not parameters
            total += int(problem.node_usages(i).min())
    return total


def per_layer(graphs, policy_of, mesh_shape=(1,)) -> int:
    counts = []
    for layers in (2, 1):
        graph = graphs[layers]
        policy = policy_of(graph) if callable(policy_of) else policy_of
        counts.append(kept_bytes(_build(graph, policy, mesh_shape), graph.backward_start + 1))
    return counts[0] - counts[1]


def published(selective: bool) -> float:
    sbh = SEQ * BATCH * HIDDEN
    attention = 0 if selective else 5 * HEADS * SEQ / HIDDEN
    wider_masks = (MASK_BYTES - 1) * ((0 if selective else HEADS * SEQ * SEQ * BATCH) + 2 * sbh)
    weight_transposes = 12 * HIDDEN * HIDDEN * 2
    return sbh * (34 + attention) + wider_masks + weight_transposes


@pytest.mark.parametrize("tensor_parallel", [1, 4])
@pytest.mark.parametrize("selective", [False, True])
def test_a_gpt_layer_keeps_what_korthikanti_counts(graphs, selective: bool, tensor_parallel: int) -> None:
    policy = korthikanti_selective if selective else "none"
    measured = per_layer(graphs, policy, (tensor_parallel,))
    assert measured == pytest.approx(published(selective) / tensor_parallel, rel=0.05)


def test_full_recomputation_keeps_the_layer_input_and_little_else(graphs) -> None:
    full, none = per_layer(graphs, "full"), per_layer(graphs, "none")
    sbh = SEQ * BATCH * HIDDEN
    assert full < 0.1 * none
    assert full >= 2 * sbh  # the layer's input, bf16


def test_auto_without_a_limit_recomputes_nothing_that_costs(graphs) -> None:
    graph = graphs[2]
    none, auto = _build(graph, "none"), _build(graph, "auto")
    fastest_none = solve(none.problem, SolveOptions(time_limit=20, relative_gap=0))
    fastest_auto = solve(auto.problem, SolveOptions(time_limit=20, relative_gap=0))
    assert fastest_auto.cost == pytest.approx(fastest_none.cost, rel=1e-6)


def test_auto_under_a_limit_only_recomputation_meets_recomputes_and_fits(graphs) -> None:
    graph = graphs[2]  # on one device: no placement frees memory, only recomputation does
    none = _build(graph, "none")
    peak = solve(none.problem, SolveOptions(time_limit=20, relative_gap=0)).peak_usage
    limit = int(0.8 * peak)
    with pytest.raises(InfeasibleError):
        solve(none.problem.replace(usage_limit=limit), SolveOptions(time_limit=20, relative_gap=0.01))
    auto = _build(graph, "auto", memory_limit=limit)
    result = solve(auto.problem, SolveOptions(time_limit=20, relative_gap=0.01))
    assert result.solution is not None and result.peak_usage <= limit
    chosen = np.asarray(result.solution)
    assert any(node.recomputed(int(chosen[i])) for i, node in enumerate(auto.nodes))


def test_a_value_the_next_layer_reads_back_is_never_recomputed(graphs) -> None:
    graph = graphs[2]
    built = _build(graph, "full")
    layer_outputs = {"add_1"}  # layer 0's output: the input of layer 1, read by its backward too
    for node in built.nodes:
        if node.kind == "op" and node.name in layer_outputs:
            assert node.modes is None or RECOMPUTE not in node.modes


def test_an_in_place_write_is_recomputed_only_with_what_it_writes_into(graphs) -> None:
    built = _build(graphs[2], "full")
    by_name = {node.name: node for node in built.nodes}
    # dropout: empty_like -> bernoulli_ (writes into it) -> div_ (writes again): the mask is made again whole
    mask = by_name["div_"]
    assert mask.modes is not None and (mask.modes == RECOMPUTE).all()


def test_an_unknown_policy_names_the_choices() -> None:
    with pytest.raises(ValueError, match="auto, none, selective, full"):
        check_policy("sometimes")
