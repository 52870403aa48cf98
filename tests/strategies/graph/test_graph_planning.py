"""Planning from an exported graph document gives the plan of the module itself (issue 14, part 2)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from strategies.graph.capture import JointGraph
from strategies.graph.export import export_graph, graph_document, graph_json
from strategies.graph.imported import load_graph, read_graph
from strategies.graph.passes import capture_for_planning
from strategies.models import build_model
from strategies.plan.planner import PlanRequest, capture_request, plan_model
from strategies.problem.layer_repeat import LayerRepeat
from tests.strategies.graph.graph_documents import (
    REQUESTS,
    SMALL_LLAMA,
    exported_text,
    graph_request,
    module_request,
)

SAME = ("mesh", "parameters", "inputs", "nodes", "predicted", "warnings", "layers")
"""Plan fields that must be equal: placements of everything, and every predicted figure."""


@pytest.fixture(scope="module", params=sorted(REQUESTS))
def plans(request: pytest.FixtureRequest) -> tuple[str, Any, Any]:
    """(name, outcome planned from the module, outcome planned from its document's JSON text)."""
    name = request.param
    from_module = plan_model(module_request(name))
    from_graph = plan_model(graph_request(name, read_graph(exported_text(name))))
    return name, from_module, from_graph


def test_planning_the_document_builds_the_same_problem(plans: tuple[str, Any, Any]) -> None:
    _, from_module, from_graph = plans
    assert from_graph.built.problem.content_hash == from_module.built.problem.content_hash
    assert [n.name for n in from_graph.built.nodes] == [n.name for n in from_module.built.nodes]


def test_planning_the_document_gives_the_same_plan_and_cost(plans: tuple[str, Any, Any]) -> None:
    name, from_module, from_graph = plans
    a, b = from_module.plan, from_graph.plan
    assert a["solver"]["status"] == b["solver"]["status"] == "optimal"
    for field in SAME:
        assert b.get(field) == a.get(field), field
    assert b["solver"]["objective"] == a["solver"]["objective"]
    assert b["predicted"]["step_time_s"] == a["predicted"]["step_time_s"] > 0
    assert b["request"]["model"] == "" and a["request"]["graph"] is None
    graph = b["request"]["graph"]  # the document by digest, not whole
    assert graph["format"] == "autoshard.graph" and graph["model"] == REQUESTS[name]["model"]
    assert len(graph["sha256"]) == 64 and graph["nodes"] == len(json.loads(exported_text(name))["nodes"])


def test_the_deep_llama_document_holds_four_of_seven_layers() -> None:
    imported = load_graph(read_graph(exported_text("llama")))
    assert imported.repeat == LayerRepeat(captured=4, total=7)
    assert {p.split(".")[1] for p in imported.graph.parameters if p.startswith("layers.")} == {
        "0",
        "1",
        "2",
        "3",
    }


def _same_graph(loaded: JointGraph, captured: JointGraph) -> None:
    """Node for node: names, ops, arguments (nodes by name), output shapes, strides and dtypes, roles."""

    def shown(value: Any) -> str:
        return repr(torch.fx.node.map_arg(value, lambda n: f"%{n.name}"))

    def outputs(node: torch.fx.Node) -> list[Any]:
        val = node.meta.get("val")
        vals = val if isinstance(val, (tuple, list)) else [val]
        return [(tuple(v.shape), v.stride(), v.dtype) if isinstance(v, torch.Tensor) else v for v in vals]

    mine, theirs = list(loaded.gm.graph.nodes), list(captured.gm.graph.nodes)
    assert [n.name for n in mine] == [n.name for n in theirs]
    for a, b in zip(mine, theirs, strict=True):
        assert (a.op, shown(a.args), shown(a.kwargs)) == (b.op, shown(b.args), shown(b.kwargs))
        assert a.op == "placeholder" or a.target is b.target  # a placeholder's target: its name in code
        assert type(a.meta.get("val")) is type(b.meta.get("val")), a.name
        assert outputs(a) == outputs(b), a.name
    assert loaded.module_path == captured.module_path
    assert loaded.backward_start == captured.backward_start
    for role in ("parameters", "buffers", "gradients", "input_gradients"):
        assert {k: v.name for k, v in getattr(loaded, role).items()} == {
            k: v.name for k, v in getattr(captured, role).items()
        }, role
    assert [n.name for n in loaded.inputs] == [n.name for n in captured.inputs]
    assert loaded.loss.name == captured.loss.name and loaded.tied == captured.tied


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_the_loaded_graph_is_the_captured_graph_node_for_node(name: str) -> None:
    request = module_request(name)
    layers = 4 if name == "llama" else request.layers
    captured, _ = capture_request(request, layers)
    _same_graph(load_graph(read_graph(graph_json(graph_document(captured)))).graph, captured)


def test_a_launcher_exports_its_own_short_module_standing_for_the_deep_one() -> None:
    request = REQUESTS["llama"]
    spec = build_model("llama3-8b", batch=request["batch"], seq=request["seq"], layers=4, **SMALL_LLAMA)
    document = export_graph(spec.module, spec.example_inputs, spec.loss_fn, total_layers=7, model="llama3-8b")
    assert document == json.loads(exported_text("llama"))  # what `autoshard export-graph` writes


def test_a_short_module_whose_middle_layers_differ_cannot_stand_for_a_deep_one() -> None:
    class Block(torch.nn.Module):
        def __init__(self, width: int) -> None:
            super().__init__()
            self.w = torch.nn.Linear(8, width)
            self.back = torch.nn.Linear(width, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.back(torch.relu(self.w(x)))

    class Stack(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList(Block(w) for w in (16, 16, 32, 16))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.layers:
                x = layer(x)
            return x

    x = torch.randn(4, 8)
    with pytest.raises(
        ValueError, match="total_layers: the 2 middle layers of the capture are not identical"
    ):
        export_graph(Stack(), [x], total_layers=12)
    document = export_graph(Stack(), [x], total_layers=4)  # the whole stack: no repeat
    assert document["layers"] is None and document["model"] == "Stack"
    captured = capture_for_planning(Stack(), [x])
    _same_graph(load_graph(document).graph, captured)


def test_the_cli_exports_a_graph_and_plans_it(tmp_path: Path) -> None:
    graph, plan = tmp_path / "graph.json", tmp_path / "plan.json"
    autoshard = [sys.executable, "-m", "service.cli"]
    export = subprocess.run(
        [*autoshard, "export-graph", "--model", "mlp", "--batch", "64", "-o", str(graph), "-q"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert export.returncode == 0, export.stderr
    assert graph.read_text() == exported_text("mlp") + "\n"
    planned = subprocess.run(
        [*autoshard, "plan", "--graph", str(graph), "--mesh", "4", "--gap", "0", "--out", str(plan), "-q"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert planned.returncode == 0, planned.stderr
    expected = plan_model(module_request("mlp")).plan
    got = json.loads(plan.read_text())
    assert got["parameters"] == expected["parameters"] and got["predicted"] == expected["predicted"]
    graph.write_text(json.dumps({"format": "autoshard.graph", "version": 2}))
    refused = subprocess.run(
        [*autoshard, "plan", "--graph", str(graph), "--mesh", "4", "--out", str(plan)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert refused.returncode == 2
    assert "version: version 2 is not supported" in refused.stderr


def test_a_graph_request_refuses_shapes_and_a_model_beside_it() -> None:
    document = read_graph(exported_text("mlp"))
    for extra, field in (
        ({"batch": 8}, "batch"),
        ({"options": {"d": 8}}, "options"),
        ({"model": "mlp"}, "model"),
    ):
        request = graph_request("mlp", document)
        for key, value in extra.items():
            setattr(request, key, value)
        with pytest.raises(ValueError, match=f"^{field}: "):
            plan_model(request)


def test_constants_tied_parameters_and_input_gradients_survive_the_round_trip() -> None:
    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = torch.nn.Linear(8, 8)
            self.outer = self.inner  # one parameter under two names

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.outer(torch.tanh(self.inner(x)))

    target = torch.randn(4, 8)  # a real tensor the loss closes over: a constant of the step
    x = torch.randn(4, 8, requires_grad=True)
    document = export_graph(Tied(), [x], lambda out: ((out - target) ** 2).mean())
    assert document["tied"] == {"inner.weight": ["outer.weight"], "inner.bias": ["outer.bias"]}
    assert document["constants"] == ["_tensor_constant0"] and list(document["input_gradients"]) == ["0"]
    loaded = load_graph(read_graph(graph_json(document))).graph
    captured = capture_for_planning(Tied(), [x], lambda out: ((out - target) ** 2).mean())
    _same_graph(loaded, captured)
    assert list(loaded.buffers) == ["_tensor_constant0"] and loaded.input_gradients[0].name == (
        captured.input_gradients[0].name
    )


@pytest.mark.parametrize(
    ("field", "value"), [("batch", 8), ("seq", 64), ("layers", 2), ("options", {"d": 64})]
)
def test_a_field_the_graph_fixes_is_refused_beside_it_by_name(field: str, value: Any) -> None:
    document = json.loads(exported_text("mlp"))
    request = PlanRequest(model="", mesh="4", graph=document, **{field: value})
    with pytest.raises(ValueError, match=f"^{field}: a graph fixes its own shapes"):
        plan_model(request)
