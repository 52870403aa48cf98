"""A short capture standing for a deep stack: weights, ghosts, names, and equality with the whole capture."""

from __future__ import annotations

import numpy as np
import pytest

from solver.evaluate import total_cost, usage_profile
from strategies.graph.capture import capture_step
from strategies.models import build_model
from strategies.placement import NONE, R
from strategies.plan.explain import explain, solution_from_plan
from strategies.plan.planner import PlanRequest, _layer_repeat, plan_model
from strategies.problem.builder import _inherit_layer_paths
from strategies.problem.layer_repeat import LayerRepeat, cost_weights, ghost_intervals
from strategies.problem.layer_sharing import layer_of

SMALL_LLAMA = {"dim": 256, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 512, "ffn_dim": 768}
LAYERS = 7


def test_layer_names_and_weights() -> None:
    repeat = LayerRepeat(captured=4, total=32)
    assert repeat.middle_weight == 15.0
    assert repeat.boundary_weight == 29.0
    assert repeat.left_out == 28
    assert repeat.full_layer(0) == [0]
    assert repeat.full_layer(1) == list(range(1, 30))
    assert repeat.full_layer(2) == [30]
    assert repeat.full_layer(3) == [31]
    names = repeat.expand_names({"layers.1.w": "a", "layers.3.w": "b", "norm.weight": "c"})
    assert len(names) == 29 + 1 + 1
    assert names["layers.29.w"] == "a" and names["layers.31.w"] == "b" and names["norm.weight"] == "c"
    assert repeat.captured_name("layers.17.attention.wq.weight") == "layers.1.attention.wq.weight"
    assert repeat.captured_name("layers.30.w") == "layers.2.w"
    assert repeat.captured_name("layers.31.w") == "layers.3.w"
    assert repeat.full_name("layers.3.w") == "layers.31.w"
    with pytest.raises(ValueError, match="at least 4"):
        LayerRepeat(captured=3, total=10)


def test_cost_weights_per_edge_kind() -> None:
    repeat = LayerRepeat(captured=4, total=10)  # middle copies 1, 2 stand for 4 layers each; 7 boundaries
    node_layer = [0, 1, 1, 2, 3, None]
    edges = [(0, 1), (1, 2), (2, 3), (3, 4), (5, 1), (5, 0)]
    node_weight, edge_weight = cost_weights(repeat, node_layer, edges, middle=[1, 2])
    assert node_weight.tolist() == [1, 4, 4, 4, 1, 1]
    # first -> middle once; inside a middle copy x4; middle -> next middle x7; middle -> last once;
    # a tensor outside every layer read by a middle copy x4, by the first layer once
    assert edge_weight.tolist() == [1, 4, 7, 1, 4, 1]


def test_ghosts_cover_parameters_gradients_and_saved_activations_only() -> None:
    intervals = [(0, 100), (40, 100), (10, 60), (11, 13), (12, 15)]
    kinds = ["parameter", "gradient", "op", "op", "op"]
    ghosts = ghost_intervals(
        intervals, kinds, [0, 1, 2, 3, 4], forward_end=20, backward_start=50, step_end=100
    )
    assert ghosts == [(0, (0, 100)), (1, (40, 100)), (2, (20, 50))]


def test_residual_gradient_accumulations_keep_their_own_layer() -> None:
    spec = build_model("llama3-8b", batch=2, seq=32, layers=4, **SMALL_LLAMA)
    graph = capture_step(spec.module, spec.example_inputs, spec.loss_fn)
    paths = _inherit_layer_paths(graph.order, graph.module_path)
    backward = graph.order[graph.backward_start :]
    per_layer = [
        sum(1 for n in backward if layer_of(paths.get(n.name, "")) == layer and "add" in str(n.target))
        for layer in range(4)
    ]
    # the middle layers' backward ops (accumulations included) are as many as each other
    assert per_layer[1] == per_layer[2]


def _all_replicate(built) -> np.ndarray:
    chosen = []
    for node in built.nodes:
        ok = np.isin(node.output_specs, (R, NONE)).all(axis=(1, 2))
        if node.input_specs.shape[1]:
            ok &= np.isin(node.input_specs, (R, NONE)).all(axis=(1, 2))
        chosen.append(int(np.flatnonzero(ok)[0]))
    return np.array(chosen)


@pytest.fixture(scope="module")
def outcomes():
    """Plans of the same 7-layer model, captured whole and with 4 layers standing for 7."""
    result = {}
    for captured in (None, 4):
        request = PlanRequest(
            model="llama3-8b",
            mesh="4",  # proven optimal in ~1 s (on 2x2: ~14 s per plan, twice)
            batch=8,
            seq=256,
            layers=LAYERS,
            time_limit=60,
            gap=0.0,
            captured_layers=captured,
            options=SMALL_LLAMA,
        )
        result[captured] = plan_model(request)
    return result


def test_short_capture_prices_the_replicated_step_like_the_whole_stack(outcomes) -> None:
    whole = outcomes[None].built
    short = outcomes[4].built
    assert short.repeat == LayerRepeat(4, LAYERS) and whole.repeat is None
    assert len(short.nodes) < len(whole.nodes)
    whole_r, short_r = _all_replicate(whole), _all_replicate(short)
    assert total_cost(short.problem, short_r) == pytest.approx(total_cost(whole.problem, whole_r), rel=1e-9)
    whole_peak = usage_profile(whole.problem, whole_r)[1].max()
    assert usage_profile(short.problem, short_r)[1].max() == whole_peak


def test_short_capture_plans_the_same_optimum_as_the_whole_stack(outcomes) -> None:
    plans = {captured: outcome.plan for captured, outcome in outcomes.items()}
    whole, short = plans[None], plans[4]
    assert whole["solver"]["status"] == short["solver"]["status"] == "optimal"
    assert short["solver"]["objective"] == pytest.approx(whole["solver"]["objective"], rel=1e-9)
    # two optima of one objective (collectives priced less their overlap credit) may hide differently
    assert short["predicted"]["step_time_s"] == pytest.approx(whole["predicted"]["step_time_s"], rel=0.01)
    assert set(short["parameters"]) == set(whole["parameters"])
    assert len(short["parameters"]) == 2 + 1 + LAYERS * 9  # embedding, norm, output; 9 per layer
    assert short["layers"] == {"captured": 4, "total": LAYERS}
    assert "layers" not in whole
    middle = {k: v for k, v in short["parameters"].items() if ".attention.wq." in k}
    assert len({str(v) for k, v in middle.items() if layer_of(k) not in (0, LAYERS - 1)}) == 1


def test_explain_maps_any_layer_to_its_captured_copy(outcomes) -> None:
    outcome = outcomes[4]
    built, plan = outcome.built, outcome.plan
    chosen, unmapped = solution_from_plan(built, plan)
    kinds = {node.name: node.kind for node in built.nodes}
    assert {kinds[name] for name in unmapped} <= {"buffer"}  # plans name parameters, inputs and ops only
    assert total_cost(built.problem, chosen) == pytest.approx(outcome.result.cost, rel=1e-9)
    report = explain(built, chosen, "layers.4.attention.wq.weight")
    assert report["node"] == "layers.1.attention.wq.weight"
    assert report["chosen"]["placements"] == plan["parameters"]["layers.4.attention.wq.weight"]
    last = explain(built, chosen, f"layers.{LAYERS - 1}.feed_forward.w2.weight")
    assert last["node"] == "layers.3.feed_forward.w2.weight"


def test_which_requests_get_a_short_capture() -> None:
    def repeat(**fields):
        return _layer_repeat(PlanRequest(mesh="4", **fields))

    assert repeat(model="llama3-8b") == LayerRepeat(4, 32)
    assert repeat(model="llama3-70b") == LayerRepeat(4, 80)
    assert repeat(model="llama3-8b", layers=12, captured_layers=6) == LayerRepeat(6, 12)
    assert repeat(model="gpt2-small", options={"n_layers": 3}) is None  # not deeper than the capture
    assert repeat(model="llama3-8b", layers=4) is None
    assert repeat(model="llama3-8b", captured_layers=None) is None
    assert repeat(model="llama3-8b", share_layers=False) is None
    assert repeat(model="mlp") is None
