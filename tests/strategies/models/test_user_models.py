"""Users' models from everywhere plan, never crash (issue 4): ``path/file.py:factory`` files under
``user_models/`` with GPT-2 (tied embeddings) and Llama (grouped-query attention) built from ``transformers``
configs, a conv net with its own loss function, and a custom ``torch.library`` op autoshard has no rule for.
"""

from __future__ import annotations

import json
import logging
import textwrap
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from service.cli import app
from strategies.graph.capture import capture_step
from strategies.models import load_factory
from strategies.ops.generate import clear_cache
from strategies.placement import R, parse_spec
from strategies.plan.planner import PlanRequest, plan_model

USER_MODELS = Path(__file__).parent / "user_models"
CUSTOM_OP = "user_ops.soft_clip.default"


def model(name: str, factory: str = "factory") -> str:
    return f"{USER_MODELS / name}.py:{factory}"


def plan(name: str, mesh: str) -> dict:
    return plan_model(PlanRequest(model=model(name), mesh=mesh, time_limit=10)).plan


def aliases(module: torch.nn.Module) -> set[str]:
    """The other names of parameters reachable under several (tied weights)."""
    first = {n for n, _ in module.named_parameters()}
    return {n for n, _ in module.named_parameters(remove_duplicate=False)} - first


def assert_valid_spec(spec: list[str], shape: tuple[int, ...], mesh_shape: list[int]) -> None:
    """One placement per mesh axis, each ``R`` or ``S(d)`` of a dim cut into at most as many pieces as it
    has elements (a parameter is stored, never partial)."""
    codes = parse_spec(spec)
    assert len(codes) == len(mesh_shape), spec
    pieces = [1] * len(shape)
    for code, size in zip(codes, mesh_shape, strict=True):
        assert code == R or 0 <= code < len(shape), spec
        if code >= 0:
            pieces[code] *= size
    assert all(p <= max(n, 1) for p, n in zip(pieces, shape, strict=True)), (spec, shape)


@pytest.mark.parametrize(
    ("name", "mesh"), [("hf_gpt2", "4"), ("hf_llama", "4"), ("conv", "2x2"), ("custom_op", "2x2")]
)
def test_every_user_model_plans_each_parameter_once_in_a_valid_placement(name: str, mesh: str) -> None:
    result = plan(name, mesh)
    module = load_factory(model(name)).module
    shapes = {n: tuple(p.shape) for n, p in module.named_parameters()}  # a tied parameter: first name only
    assert sorted(result["parameters"]) == sorted(shapes)
    assert len(result["parameters"]) == len(list(module.parameters()))
    assert not aliases(module) & set(result["parameters"])
    mesh_shape = result["mesh"]["shape"]
    assert mesh_shape == [int(s) for s in mesh.split("x")]
    for param_name, spec in result["parameters"].items():
        assert_valid_spec(spec, shapes[param_name], mesh_shape)
    for node in result["nodes"]:
        for spec in (*node["output"], *node["inputs"]):
            assert spec is None or len(parse_spec(spec)) == len(mesh_shape), node
    assert result["predicted"]["step_time_s"] > 0
    assert result["predicted"]["compute_s"] > 0
    assert result["solver"]["status"] in ("optimal", "feasible")
    assert 0 <= result["solver"]["gap"] < 1


def test_gpt2_tied_embedding_is_planned_once_under_its_first_name() -> None:
    module = load_factory(model("hf_gpt2")).module
    assert module.lm_head.weight is module.transformer.wte.weight
    assert aliases(module) == {"lm_head.weight"}
    graph = capture_step(*load_factory(model("hf_gpt2")))
    assert graph.tied == {"transformer.wte.weight": ["lm_head.weight"]}
    assert "transformer.wte.weight" in graph.parameters and "lm_head.weight" not in graph.parameters


@pytest.mark.parametrize("name", ["hf_gpt2", "hf_llama"])
def test_the_step_loss_of_a_hugging_face_model_is_its_output_loss(name: str) -> None:
    spec = load_factory(model(name))
    module = spec.module.eval()  # no dropout: the captured step and eager draw no random numbers
    graph = capture_step(module, spec.example_inputs)  # no loss_fn: the output's .loss
    cross_entropy = graph.loss.args[0]
    assert cross_entropy.target is torch.ops.aten.nll_loss_forward.default
    assert cross_entropy.args[4] == -100  # HF's ignore index: the shifted labels' padding
    params = dict(module.named_parameters())
    buffers = {**dict(module.named_buffers()), **graph.constants}
    loss, grads = graph.gm(params, buffers, *spec.example_inputs.values())
    expected = module(**spec.example_inputs).loss
    expected.backward()
    torch.testing.assert_close(loss, expected)
    assert len(grads) == len(params)
    for grad, (param_name, p) in zip(grads, params.items(), strict=True):
        torch.testing.assert_close(grad, p.grad, atol=1e-5, rtol=1e-4, msg=param_name)


def test_a_hugging_face_model_on_the_meta_device_captures_the_same_step() -> None:
    on_meta = load_factory(model("hf_llama", "factory_on_meta"))
    assert all(p.is_meta for p in on_meta.module.parameters())
    assert all(b.is_meta for b in on_meta.module.buffers())  # the rotary tables too
    ops = [str(n.target) for n in capture_step(*on_meta).order]
    assert ops == [str(n.target) for n in capture_step(*load_factory(model("hf_llama"))).order]
    assert "aten._scaled_dot_product_flash_attention_for_cpu.default" in ops


def test_a_loss_fn_holding_its_labels_gives_the_step_of_eager_autograd() -> None:
    spec = load_factory(model("conv"))
    graph = capture_step(*spec)
    assert [tuple(c.shape) for c in graph.constants.values()] == [(8,)]  # the labels, one placeholder
    params = dict(spec.module.named_parameters())
    buffers = {n: b.clone() for n, b in spec.module.named_buffers()}  # batch norm updates its statistics
    loss, grads = graph.gm(params, {**buffers, **graph.constants}, *spec.example_inputs)
    expected = spec.loss_fn(spec.module(*spec.example_inputs))
    expected.backward()
    torch.testing.assert_close(loss, expected)
    for grad, (param_name, p) in zip(grads, params.items(), strict=True):
        torch.testing.assert_close(grad, p.grad, atol=1e-5, rtol=1e-4, msg=param_name)


def test_a_custom_op_without_rules_is_replicated_with_a_warning_naming_it(caplog) -> None:
    clear_cache()  # the warning comes with the op's strategies, which an earlier plan may have cached
    with caplog.at_level(logging.WARNING, logger="autoshard.strategies"):
        result = plan("custom_op", "4")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(CUSTOM_OP in message and "replicate" in message for message in warnings), warnings
    nodes = [n for n in result["nodes"] if n["op"] == CUSTOM_OP]
    assert len(nodes) == 1
    assert nodes[0]["output"] == [["R"]] and nodes[0]["inputs"] == [["R"]]
    # the plan says so too, also when the strategies come from the cache (a service's second plan)
    again = plan("custom_op", "4")
    for planned in (result, again):
        assert [w for w in planned["warnings"] if CUSTOM_OP in w and "replicated" in w], planned["warnings"]
        assert len(planned["warnings"]) == 1, planned["warnings"]


def test_a_factory_file_is_imported_once_per_version(tmp_path: Path) -> None:
    first = load_factory(model("custom_op"))  # registers user_ops::soft_clip when imported
    second = load_factory(model("custom_op"))  # a second import would register it again, and fail
    assert first.module is not second.module  # the factory runs each time,
    assert type(first.module) is type(second.module)  # on the classes of one import
    path = tmp_path / "with_dataclass.py"
    path.write_text(
        textwrap.dedent(
            """
            from __future__ import annotations
            from dataclasses import dataclass
            import torch

            @dataclass
            class Sizes:
                d: int = 4

            def factory():
                return torch.nn.Linear(Sizes().d, 2), (torch.randn(3, Sizes().d),)
            """
        )
    )
    assert load_factory(f"{path}:factory").module.in_features == 4  # dataclasses find their module


def autoshard(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_autoshard_plan_takes_a_factory_file(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    code, stdout, stderr = autoshard(
        "plan", "--model", model("conv"), "--mesh", "2x2", "--out", str(out), "--time-limit", "10"
    )
    assert code == 0, stderr
    result = json.loads(out.read_text())
    assert result["request"]["model"] == model("conv")
    assert sorted(result["parameters"]) == sorted(
        n for n, _ in load_factory(model("conv")).module.named_parameters()
    )
    assert "capturing" in stderr and "certificate:" in stdout and f"plan written to {out}" in stdout


def test_a_model_whose_output_has_no_loss_exits_2_asking_for_loss_fn(tmp_path: Path) -> None:
    path = tmp_path / "two_outputs.py"
    path.write_text(
        textwrap.dedent(
            """
            import torch

            class TwoHeads(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.a, self.b = torch.nn.Linear(4, 2), torch.nn.Linear(4, 3)

                def forward(self, x):
                    return self.a(x), self.b(x)

            def factory():
                return TwoHeads(), (torch.randn(5, 4),)
            """
        )
    )
    code, _, stderr = autoshard(
        "plan", "--model", f"{path}:factory", "--mesh", "2", "--out", str(tmp_path / "p")
    )
    assert code == 2 and "loss_fn" in stderr and "Traceback" not in stderr
