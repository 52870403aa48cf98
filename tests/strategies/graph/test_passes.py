"""``expose_sequence_dims`` and the ``autoshard::einsum`` op it writes.

Each rewrite is pinned on real captured joint graphs: how many matmuls become einsums (forward, grad input,
grad weight), that the rewritten graph computes the original's loss and gradients on real tensors, and that
the einsums offer sequence (``S(1)``) shardings the flattened matmuls could not.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._pytree import tree_leaves

from strategies.cost.mesh import make_mesh
from strategies.graph.capture import capture_joint, op_calls
from strategies.graph.passes import exact_mean_losses, expose_sequence_dims
from strategies.graph.rewrite import PROVENANCE_KEYS
from strategies.models.llama import LlamaConfig, TransformerBlock, rope_tables
from strategies.ops.einsum_ops import EINSUM, einsum, einsum_flops, parse_equation
from strategies.ops.generate import op_strategies
from strategies.ops.registry import OpInfo
from strategies.placement import P, R
from strategies.tensor_meta import TensorMeta

aten = torch.ops.aten
MATMULS = (aten.mm.default, aten.addmm.default)
FORWARD, WEIGHT_GRAD = "bsk,kn->bsn", "bsk,bsn->kn"
SMALL_LLAMA = LlamaConfig(
    dim=32, n_layers=1, n_heads=4, n_kv_heads=2, vocab_size=64, ffn_dim=48, max_seq_len=16
)


class MLP(nn.Module):
    """Two linear layers, the first with a bias, on ``[B, S, K]``."""

    def __init__(self, k: int = 8, hidden: int = 16) -> None:
        super().__init__()
        self.up = nn.Linear(k, hidden)
        self.down = nn.Linear(hidden, k, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


class HeadsProjection(nn.Module):
    """A projection written as ``mm`` on the flattened input, viewed straight to ``[B, S, H, D]``: its
    backward flattens the ``[B, S, H, D]`` gradient to ``[B*S, H*D]`` in one view."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(16, 8))
        self.bias = nn.Parameter(torch.randn(16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, k = x.shape
        y = torch.addmm(self.bias, x.reshape(-1, k), self.weight.t()).view(b, s, 4, 4)
        return (y * y).sum()


def _pair(module: nn.Module, inputs: list[Any]) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule, int]:
    """The captured joint graph, and a second capture rewritten by the pass with its count."""
    original, rewritten = capture_joint(module, inputs), capture_joint(module, inputs)
    return original, rewritten, expose_sequence_dims(rewritten)


def _count(gm: torch.fx.GraphModule, targets: tuple) -> int:
    return sum(node.op == "call_function" and node.target in targets for node in gm.graph.nodes)


def _equations(gm: torch.fx.GraphModule) -> Counter:
    return Counter(node.args[0] for node in gm.graph.nodes if node.target == EINSUM)


def _assert_same_step(
    original: torch.fx.GraphModule, rewritten: torch.fx.GraphModule, module: nn.Module, inputs: list[Any]
) -> None:
    """Both graphs, run on real tensors (parameters, buffers, inputs), give the same loss and gradients."""
    params, buffers = dict(module.named_parameters()), dict(module.named_buffers())
    want = tree_leaves(original(params, buffers, *inputs))
    got = tree_leaves(rewritten(params, buffers, *inputs))
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


def _llama_block() -> tuple[nn.Module, list[Any]]:
    torch.manual_seed(0)
    block = TransformerBlock(SMALL_LLAMA)
    return block, [torch.randn(2, 8, SMALL_LLAMA.dim, requires_grad=True), rope_tables(SMALL_LLAMA, 8)]


@pytest.fixture(scope="module")
def llama() -> tuple[nn.Module, list[Any], torch.fx.GraphModule, torch.fx.GraphModule, int]:
    block, inputs = _llama_block()
    return block, inputs, *_pair(block, inputs)


# ------------------------------------------------------------------------------------------ the op


def test_einsum_op_and_its_gradients_match_torch_einsum() -> None:
    a = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(einsum(FORWARD, a, b), torch.einsum(FORWARD, a, b))
    assert torch.autograd.gradcheck(lambda x, y: einsum(FORWARD, x, y), (a, b))
    g = torch.randn(2, 3, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, y: einsum(WEIGHT_GRAD, x, y), (a, g))


@pytest.mark.parametrize(
    ("equation", "message"),
    [
        ("ij,jk", "form"),
        ("ij,jk,kl->il", "form"),
        ("iI,jk->ik", "lowercase"),
        ("ii,ij->j", "repeats"),
        ("ij,jk->iz", "absent"),
        ("ij,kl->il", "one operand only"),
    ],
)
def test_unsupported_equations_are_refused_by_name(equation: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_equation(equation)


def test_einsum_refuses_mismatched_sizes() -> None:
    with pytest.raises(ValueError, match="letter 'k'"):
        einsum(FORWARD, torch.randn(2, 3, 4), torch.randn(5, 6))


def test_a_graph_holding_einsum_differentiates_into_einsum() -> None:
    class Projection(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.randn(8, 6))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return einsum(FORWARD, x, self.weight)

    gm = capture_joint(Projection(), [torch.randn(2, 4, 8, requires_grad=True)])
    assert _equations(gm) == Counter({FORWARD: 1, "bsn,kn->bsk": 1, "bsk,bsn->kn": 1})
    assert _count(gm, (*MATMULS, aten.bmm.default)) == 0


def test_einsum_flops_are_twice_the_index_space() -> None:
    a, b = TensorMeta((4, 8, 16)), TensorMeta((16, 32))
    info = OpInfo(EINSUM, (FORWARD, a, b), {}, (a, b), (TensorMeta((4, 8, 32)),))
    assert einsum_flops(info, [(4, 8, 16), (16, 32)], [(4, 8, 32)]) == 2.0 * 4 * 8 * 16 * 32
    assert einsum_flops(info, [(4, 2, 16), (16, 32)], [(4, 2, 32)]) == 2.0 * 4 * 2 * 16 * 32  # local shard


# -------------------------------------------------------------------------------------------- pass


def test_mlp_forward_and_both_gradients_become_einsums() -> None:
    torch.manual_seed(0)
    mlp, inputs = MLP(), [torch.randn(2, 4, 8, requires_grad=True)]
    original, rewritten, count = _pair(mlp, inputs)
    assert _count(original, MATMULS) == 6
    assert count == 6
    assert _count(rewritten, MATMULS) == 0
    assert _equations(rewritten) == Counter({FORWARD: 4, WEIGHT_GRAD: 2})
    _assert_same_step(original, rewritten, mlp, inputs)


def test_mlp_bias_gradient_sums_over_batch_and_sequence() -> None:
    _, rewritten, _ = _pair(MLP(), [torch.randn(2, 4, 8)])
    sums = [n for n in rewritten.graph.nodes if n.target == aten.sum.dim_IntList]
    assert [(tuple(n.args[0].meta["val"].shape), n.args[1]) for n in sums] == [((2, 4, 16), [0, 1])]


def test_four_dim_input_keeps_three_leading_dims() -> None:
    torch.manual_seed(0)
    linear, inputs = nn.Linear(8, 6), [torch.randn(2, 3, 4, 8, requires_grad=True)]
    original, rewritten, count = _pair(linear, inputs)
    assert count == 3
    assert _equations(rewritten) == Counter({"bshk,kn->bshn": 2, "bshk,bshn->kn": 1})
    _assert_same_step(original, rewritten, linear, inputs)


def test_views_to_heads_are_unflattened_on_both_sides() -> None:
    """The forward result viewed to ``[B, S, H, D]`` becomes einsum + view; the ``[B, S, H, D]`` gradient
    flattened to ``[B*S, H*D]`` becomes one ``[B, S, H*D]`` view shared by both gradient einsums."""
    torch.manual_seed(0)
    module, inputs = HeadsProjection(), [torch.randn(2, 4, 8, requires_grad=True)]
    original, rewritten, count = _pair(module, inputs)
    assert count == 3
    merged = [n for n in rewritten.graph.nodes if n.target == aten.view.default and n.args[1] == [2, 4, 16]]
    assert len(merged) == 1
    assert Counter(u.target for u in merged[0].users) == Counter({EINSUM: 2, aten.sum.dim_IntList: 1})
    _assert_same_step(original, rewritten, module, inputs)


def test_two_dim_inputs_are_left_alone() -> None:
    mlp, inputs = MLP(), [torch.randn(6, 8, requires_grad=True)]
    original, rewritten, count = _pair(mlp, inputs)
    assert count == 0
    assert [n.target for n in rewritten.graph.nodes] == [n.target for n in original.graph.nodes]


def test_llama_block_matmuls_all_become_einsums(llama) -> None:
    block, inputs, original, rewritten, count = llama
    assert _count(original, MATMULS) == 21  # 7 projections x (forward, grad input, grad weight)
    assert count == 21
    assert _count(rewritten, MATMULS) == 0
    assert _equations(rewritten) == Counter({FORWARD: 14, WEIGHT_GRAD: 7})
    _assert_same_step(original, rewritten, block, inputs)


def test_einsums_keep_the_provenance_of_their_matmuls() -> None:
    """Module path and autograd sequence number (what repeated-layer matching reads) survive the rewrite:
    each einsum sits where its matmul was and carries its meta."""
    gm = capture_joint(*_llama_block())
    before = [{k: n.meta.get(k) for k in PROVENANCE_KEYS} for n in gm.graph.nodes if n.target in MATMULS]
    assert any(meta["nn_module_stack"] for meta in before)
    expose_sequence_dims(gm)
    after = [{k: n.meta.get(k) for k in PROVENANCE_KEYS} for n in gm.graph.nodes if n.target == EINSUM]
    assert after == before


def test_einsum_nodes_offer_sequence_shardings(llama) -> None:
    """On a 1-D mesh every einsum of the block can take its activations cut along the sequence; on a
    ``dp x sp`` mesh, batch on one axis and sequence on the other."""
    *_, rewritten, _ = llama
    calls = [call for call in op_calls(rewritten) if call.op == EINSUM]
    assert len(calls) == 21
    for mesh_shape, activation in (((4,), [1]), ((2, 2), [0, 1])):
        mesh = make_mesh(mesh_shape)
        for call in calls:
            strategies = op_strategies(call.op, call.args, call.kwargs, mesh, call.outputs)
            rows = {
                (tuple(map(tuple, strategies.input_specs[i])), tuple(map(tuple, strategies.output_specs[i])))
                for i in range(len(strategies))
            }
            replicated = tuple([R] * len(mesh_shape))
            cut = tuple(activation)
            if call.args[0] == FORWARD:
                want = ((cut, replicated), (cut,))
            else:  # batch and sequence are contracted: the weight gradient is a partial sum on every axis
                want = ((cut, cut), (tuple(P for _ in activation),))
            assert want in rows, f"{call.name} {call.args[0]} on {mesh_shape}: no sequence strategy"


# ------------------------------------------------------------------------------------- mean losses


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.head(x), target)


def test_mean_losses_become_sum_over_total_weight_with_the_same_step() -> None:
    torch.manual_seed(0)
    module = Classifier()
    inputs = [torch.randn(6, 8), torch.tensor([1, -100, -100, 4, 3, 0])]  # padding labels are ignored
    original, rewritten = capture_joint(module, inputs), capture_joint(module, inputs)
    assert exact_mean_losses(rewritten) == 1
    reductions = [
        n.args[3] for n in rewritten.graph.nodes if n.target == torch.ops.aten.nll_loss_forward.default
    ]
    assert reductions == [2]  # sum
    assert _count(rewritten, (torch.ops.aten.div.Tensor,)) == 1
    _assert_same_step(original, rewritten, module, inputs)
    # a shard's mean is not a share of the mean: only sums add up (halves count 1 and 3 targets)
    log_probs = F.log_softmax(module.head(inputs[0]), dim=-1).detach()
    halves = [F.nll_loss(log_probs[i : i + 3], inputs[1][i : i + 3]) for i in (0, 3)]
    assert not torch.allclose(sum(halves) / 2, F.nll_loss(log_probs, inputs[1]))
    sums = [F.nll_loss(log_probs[i : i + 3], inputs[1][i : i + 3], reduction="sum") for i in (0, 3)]
    torch.testing.assert_close(sum(sums) / 4, F.nll_loss(log_probs, inputs[1]))
