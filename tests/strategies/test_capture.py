"""The Llama 3 model definition and joint forward + backward capture on fake tensors."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from strategies.capture import capture_joint, default_loss, op_calls
from strategies.models.llama import (
    Attention,
    Llama,
    LlamaConfig,
    RMSNorm,
    TransformerBlock,
    apply_rope,
    llama_config,
    repeat_kv,
    rope_tables,
)

aten = torch.ops.aten
TINY = LlamaConfig(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=50, ffn_dim=48, max_seq_len=16)


@pytest.mark.parametrize(("name", "params"), [("llama3-8b", 8_030_261_248), ("llama3-70b", 70_553_706_496)])
def test_presets_have_the_published_parameter_counts(name: str, params: int) -> None:
    with torch.device("meta"):
        model = Llama(llama_config(name))
    assert sum(p.numel() for p in model.parameters()) == params


def test_a_config_whose_heads_do_not_divide_is_refused() -> None:
    with pytest.raises(ValueError, match="n_kv_heads"):
        LlamaConfig(n_heads=32, n_kv_heads=5)
    with pytest.raises(ValueError, match="unknown Llama preset"):
        llama_config("llama2-7b")
    assert llama_config("llama3-8b", n_layers=1).n_layers == 1


def test_rms_norm_matches_torch() -> None:
    norm = RMSNorm(32, 1e-5)
    torch.nn.init.normal_(norm.weight)
    x = torch.randn(3, 5, 32)
    torch.testing.assert_close(norm(x), F.rms_norm(x, (32,), norm.weight, 1e-5))


def test_rope_makes_attention_scores_depend_on_relative_position_only() -> None:
    rope = rope_tables(TINY, 16)
    q, k = torch.randn(TINY.head_dim, dtype=torch.float64), torch.randn(TINY.head_dim, dtype=torch.float64)

    def at(x: torch.Tensor, pos: int) -> torch.Tensor:
        placed = torch.zeros(1, 16, 1, TINY.head_dim, dtype=torch.float64)
        placed[0, pos, 0] = x
        return apply_rope(placed, rope.double())[0, pos, 0]

    assert torch.isclose(at(q, 5) @ at(k, 2), at(q, 10) @ at(k, 7))
    assert not torch.isclose(at(q, 5) @ at(k, 2), at(q, 5) @ at(k, 4))
    assert torch.isclose(at(q, 0), q).all()  # position 0 is not rotated
    assert torch.isclose(at(q, 9).norm(), q.norm())  # rotations keep lengths


def test_repeat_kv_shares_each_kv_head_with_consecutive_query_heads() -> None:
    kv = torch.randn(2, 3, 2, 4)
    torch.testing.assert_close(repeat_kv(kv, 3), kv.repeat_interleave(3, dim=2))


def test_attention_is_causal_grouped_query_attention() -> None:
    torch.manual_seed(0)
    attention = Attention(TINY)
    x, rope = torch.randn(2, 6, TINY.dim), rope_tables(TINY, 6)
    b, s, h, d = 2, 6, TINY.n_heads, TINY.head_dim
    q = apply_rope(attention.wq(x).view(b, s, h, d), rope)
    k = apply_rope(attention.wk(x).view(b, s, TINY.n_kv_heads, d), rope)
    v = attention.wv(x).view(b, s, TINY.n_kv_heads, d)
    group = h // TINY.n_kv_heads
    heads = []
    for head in range(h):
        scores = q[:, :, head] @ k[:, :, head // group].transpose(1, 2) / math.sqrt(d)
        scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
        heads.append(scores.softmax(-1) @ v[:, :, head // group])
    expected = attention.wo(torch.stack(heads, dim=2).reshape(b, s, h * d))
    torch.testing.assert_close(attention(x, rope), expected, atol=1e-5, rtol=1e-5)


def test_the_captured_joint_graph_computes_the_loss_and_gradients_of_eager_autograd() -> None:
    torch.manual_seed(0)
    model = Llama(TINY)
    tokens, targets = torch.randint(0, TINY.vocab_size, (2, 8)), torch.randint(0, TINY.vocab_size, (2, 8))
    gm = capture_joint(model, (tokens, targets))
    params = dict(model.named_parameters())
    loss, grads = gm(params, dict(model.named_buffers()), tokens, targets)
    expected = model(tokens, targets)
    expected.backward()
    torch.testing.assert_close(loss, expected)
    assert len(grads) == len(params)
    for grad, (name, p) in zip(grads, params.items(), strict=True):
        torch.testing.assert_close(grad, p.grad, atol=1e-5, rtol=1e-4, msg=name)


def test_gradients_of_inputs_that_require_them_are_outputs_too() -> None:
    block = TransformerBlock(TINY)
    x = torch.randn(2, 8, TINY.dim, requires_grad=True)
    gm = capture_joint(block, (x, rope_tables(TINY, 8)), lambda out: out.pow(2).mean())
    _, grads = gm(dict(block.named_parameters()), {}, x, rope_tables(TINY, 8))
    assert len(grads) == len(list(block.parameters())) + 1
    (block(x, rope_tables(TINY, 8)).pow(2).mean()).backward()
    torch.testing.assert_close(grads[-1], x.grad, atol=1e-5, rtol=1e-4)


def test_a_full_size_layer_is_captured_from_the_meta_device_without_memory() -> None:
    config = llama_config("llama3-8b")
    with torch.device("meta"):
        block = TransformerBlock(config).to(torch.bfloat16)
    x = torch.empty(16, 8192, config.dim, dtype=torch.bfloat16, device="meta", requires_grad=True)
    gm = capture_joint(block, (x, torch.empty(2, 8192, config.head_dim, device="meta")))
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    targets = {n.target for n in nodes}
    assert aten._scaled_dot_product_flash_attention_for_cpu.default in targets
    assert aten._scaled_dot_product_flash_attention_for_cpu_backward.default in targets
    mms = [n for n in nodes if n.target is aten.mm.default]
    assert len(mms) == 7 * 3  # 7 projections: one forward mm, two backward (input and weight gradients)
    fake = torch._subclasses.fake_tensor.FakeTensor
    assert all(  # every node carries fake values with shapes: tensors, or tuples of them (and of sizes)
        isinstance(n.meta["val"], fake)
        or (isinstance(n.meta["val"], (tuple, list)) and any(isinstance(v, fake) for v in n.meta["val"]))
        for n in nodes
    )
    ffn_up = next(n for n in mms if tuple(n.meta["val"].shape) == (16 * 8192, config.ffn_dim))
    assert ffn_up.meta["val"].dtype == torch.bfloat16


def test_the_default_loss_is_the_outputs_loss_or_its_sum() -> None:
    class Output:
        loss = torch.tensor(3.0)

    assert default_loss(Output()) == 3.0
    assert default_loss(torch.ones(2, 3)) == 6.0
    with pytest.raises(TypeError, match="loss_fn"):
        default_loss((torch.ones(1),))


def test_op_calls_describe_every_node_for_strategy_generation() -> None:
    from strategies.generate import op_strategies
    from strategies.mesh import make_mesh
    from strategies.tensor_meta import flatten_tensors

    tokens = torch.zeros(4, 8, dtype=torch.int64)
    with torch.device("meta"):
        model = Llama(TINY)
    calls = op_calls(capture_joint(model, (tokens, tokens)))
    assert len(calls) > 100
    mesh = make_mesh("2x2")
    results = {}
    for call in calls:
        assert len(call.producers) == len(flatten_tensors((call.args, call.kwargs))), call.name
        results[call.name] = op_strategies(call.op, call.args, call.kwargs, mesh, outputs=call.outputs)
        assert len(results[call.name]) >= 1
    # every op of a Llama training step has autoshard's own rules, none falls back
    assert {str(r.op) for r in results.values() if r.source != "autoshard"} == set()
    # and every edge gets a finite way from its producer's output to some consumer strategy
    for call in calls:
        for index, source in enumerate(call.producers):
            if source is not None:
                specs = results[source[0]].output_specs[:, source[1], :]
                matrix = results[call.name].redistribute_from(index, specs)
                assert matrix.shape == (len(results[source[0]]), len(results[call.name]))
                assert torch.isfinite(torch.from_numpy(matrix)).any(dim=1).all(), (source, call.name)
