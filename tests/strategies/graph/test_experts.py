"""Mixture-of-experts capture (:mod:`strategies.graph.experts`): ``transformers`` Mixtral and Qwen2-MoE in
float32 with grouped-mm and with eager experts, the rewrite into ``autoshard::grouped_mm``, and the one-line
error for routing whose shapes depend on values."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from strategies.graph.capture import CaptureError, JointGraph, capture_step, input_tensors
from strategies.graph.experts import explicit_expert_groups
from strategies.graph.passes import capture_for_planning
from strategies.ops.grouped_mm_ops import GROUPED_MM
from tests.strategies.models.user_models import zoo

aten = torch.ops.aten


def _targets(graph: JointGraph) -> Counter:
    return Counter(node.target for node in graph.order)


def _assert_computes_eager_step(graph: JointGraph, module: nn.Module, inputs: dict[str, Any]) -> None:
    """The graph's loss and gradients on the module's real tensors equal eager autograd's."""
    params = dict(module.named_parameters())
    with torch.no_grad():
        loss, grads = graph.gm(
            params, {**dict(module.named_buffers()), **graph.constants}, *input_tensors(inputs)
        )
    expected = module(**inputs).loss
    expected.backward()
    torch.testing.assert_close(loss, expected.detach())
    for grad, (name, p) in zip(grads, params.items(), strict=True):
        torch.testing.assert_close(grad, p.grad, atol=1e-6, rtol=1e-4, msg=name)


@pytest.mark.parametrize("factory", [zoo.mixtral, zoo.qwen2_moe], ids=lambda f: f.__name__)
def test_float32_grouped_experts_are_captured_as_explicit_groups(factory: Any) -> None:
    module, inputs = factory()
    assert module.config._experts_implementation == "grouped_mm"
    graph = capture_for_planning(module, inputs)
    ops = _targets(graph)
    # per layer: gate-up and down forward, each with a grad-input and a grad-weight product backward
    assert ops[GROUPED_MM] == 12 and aten._grouped_mm.default not in ops
    assert ops[aten.constant_pad_nd.default] >= 2  # each layer's group starts, made from its ends
    assert {n.meta["val"].dtype for n in graph.order if n.target is GROUPED_MM} == {torch.float32}
    _assert_computes_eager_step(graph, module, inputs)


def test_torchs_fake_rule_is_back_after_capture_and_no_answer_of_ours_is_cached() -> None:
    module, inputs = zoo.mixtral()
    capture_step(module, inputs)
    assert not [key for key in FakeTensorMode.cache if key.key[0] is aten._grouped_mm.default]
    with FakeTensorMode(), pytest.raises(RuntimeError, match="Expected inputs of BF16 type"):
        torch._grouped_mm(
            torch.empty(128, 64), torch.empty(4, 64, 256), offs=torch.empty(4, dtype=torch.int32)
        )


def test_eager_experts_are_captured_as_every_token_to_each_chosen_expert() -> None:
    module, inputs = zoo.mixtral()
    module.set_experts_implementation("eager")
    graph = capture_for_planning(module, inputs)
    assert module.config._experts_implementation == "eager"  # as the user left it
    assert _targets(graph)[GROUPED_MM] == 12
    rows = {
        n.args[0].meta["val"].shape[0]
        for n in graph.order
        if n.target is GROUPED_MM and n.args[1].meta["val"].ndim == 3
    }
    assert rows == {zoo.BATCH * zoo.SEQ * module.config.num_experts_per_tok}  # the bound: tokens x top_k
    _assert_computes_eager_step(graph, module, inputs)  # eager: a loop over the experts hit


class _Router(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[x.sum(-1) > 0]  # the tokens routed here: as many as the values say


class _MaskRouted(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.router = _Router()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.router(self.proj(x)).sum()


def test_routing_whose_shapes_depend_on_values_is_refused_in_one_line_naming_the_module() -> None:
    with pytest.raises(CaptureError) as caught:
        capture_step(_MaskRouted(), (torch.randn(8, 4),))
    message = str(caught.value)
    assert message.startswith("model: router (_Router) computes a shape from tensor values (aten.nonzero")
    assert "fixed expert capacity" in message and "\n" not in message


class _BatchedExperts(nn.Module):
    """Every expert on its own slice of tokens: a 3d x 3d ``_grouped_mm`` (no offsets)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 8, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch._grouped_mm(x, self.weight).square().sum()


def test_a_grouped_mm_without_offsets_becomes_a_bmm() -> None:
    module, x = _BatchedExperts(), torch.randn(4, 16, 8)
    graph = capture_step(module, (x,))
    assert explicit_expert_groups(graph.gm) == 0
    graph.refresh()
    ops = _targets(graph)
    assert aten._grouped_mm.default not in ops and ops[aten.bmm.default] == 2  # forward, weight gradient
    loss, (grad,) = graph.gm(dict(module.named_parameters()), {}, x)
    expected = torch.bmm(x, module.weight).square().sum()
    expected.backward()
    torch.testing.assert_close(loss, expected.detach())
    torch.testing.assert_close(grad, module.weight.grad)
