"""The Llama 3 model definition and joint forward + backward capture on fake tensors."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from strategies.graph.capture import (
    CaptureError,
    JointGraph,
    capture_joint,
    capture_step,
    default_loss,
    op_calls,
)
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
    from strategies.cost.mesh import make_mesh
    from strategies.ops.generate import op_strategies
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


# ------------------------------------------------------------------------------------------------ roles


def _tiny_llama_step() -> tuple[Llama, JointGraph]:
    with torch.device("meta"):
        model = Llama(TINY.replace(n_layers=3))
    tokens = torch.zeros(2, 8, dtype=torch.int64, device="meta")
    return model, capture_step(model, (tokens, tokens))


@pytest.fixture(scope="module")
def llama_step() -> tuple[Llama, JointGraph]:
    """A captured three-layer tiny Llama, shared by the tests that only read it."""
    return _tiny_llama_step()


def test_capture_step_names_parameters_buffers_inputs_loss_and_gradients(llama_step: tuple) -> None:
    model, graph = llama_step
    params = dict(model.named_parameters())
    assert list(graph.parameters) == list(params)
    for name, node in graph.parameters.items():
        assert node.op == "placeholder" and node.meta["val"].shape == params[name].shape
    assert list(graph.buffers) == ["rope"] and graph.buffers["rope"].op == "placeholder"
    assert [(n.op, n.meta["val"].dtype) for n in graph.inputs] == [("placeholder", torch.int64)] * 2
    assert graph.tied == {} and graph.input_gradients == {}
    assert graph.loss.meta["val"].shape == ()
    assert graph.gm.graph.output_node().args[0] == [graph.loss, *graph.gradients.values()]
    for name, grad in graph.gradients.items():
        assert grad.meta["val"].shape == params[name].shape, name
    # forward ops ran inside the model (which computes the loss), backward ops inside autograd's engine
    assert graph.loss in graph.forward_nodes
    assert all(n.meta["nn_module_stack"] for n in graph.forward_nodes)
    assert not any(n.meta["nn_module_stack"] for n in graph.backward_nodes)
    assert not any(n.meta.get("autograd_backward") for n in graph.forward_nodes)
    assert sum(bool(n.meta.get("autograd_backward")) for n in graph.backward_nodes) > 0.9 * len(
        graph.backward_nodes
    )


def test_backward_ops_carry_the_module_of_their_forward_op(llama_step: tuple) -> None:
    _, graph = llama_step
    assert {n.name for n in graph.order} == set(graph.module_path)
    for name, grad in graph.gradients.items():  # a weight's gradient is computed in its own module
        assert graph.module_path[grad.name] == name.rpartition(".")[0], name
    wq = [n for n in graph.order if graph.module_path[n.name] == "layers.1.attention.wq"]
    assert [str(n.target) for n in wq if n.target is aten.mm.default] == ["aten.mm.default"] * 3
    assert [n in graph.backward_nodes for n in wq if n.target is aten.mm.default] == [False, True, True]


def test_repeated_layers_have_the_same_ops_in_the_same_order_forward_and_backward(llama_step: tuple) -> None:
    _, graph = llama_step

    def layer_ops(index: int, nodes: list) -> list:
        prefix = f"layers.{index}"
        return [
            n.target
            for n in nodes
            if graph.module_path[n.name] == prefix or graph.module_path[n.name].startswith(prefix + ".")
        ]

    for nodes in (graph.forward_nodes, graph.backward_nodes):
        assert len(layer_ops(0, nodes)) > 50
        assert layer_ops(0, nodes) == layer_ops(1, nodes) == layer_ops(2, nodes)


def test_refresh_rereads_a_graph_rewritten_by_a_pass() -> None:
    _, graph = _tiny_llama_step()
    name = "layers.0.attention.wq.weight"
    old = graph.gradients[name]
    with graph.gm.graph.inserting_after(old):
        new = graph.gm.graph.call_function(aten.clone.default, (old,))  # no meta: a pass's own node
    graph.gm.graph.output_node().replace_input_with(old, new)
    graph.refresh()
    assert graph.gradients[name] is new and new in graph.backward_nodes
    assert graph.module_path[new.name] == "layers.0.attention.wq"  # from its input


class _Partly(torch.nn.Module):
    """A frozen weight, an unused weight, keyword inputs, a constant and a value nothing uses."""

    def __init__(self) -> None:
        super().__init__()
        self.frozen = torch.nn.Parameter(torch.randn(4, 4), requires_grad=False)
        self.used = torch.nn.Parameter(torch.randn(4, 4))
        self.unused = torch.nn.Parameter(torch.randn(3))

    def forward(self, x: torch.Tensor, scale: float, y: torch.Tensor) -> torch.Tensor:
        _ = x.exp()  # dead code
        return (x @ self.frozen @ self.used * scale + y).pow(2).sum()


def test_frozen_unused_and_keyword_inputs_have_the_roles_they_should() -> None:
    torch.manual_seed(0)
    module = _Partly()
    x, y = torch.randn(2, 4, requires_grad=True), torch.randn(2, 4)
    graph = capture_step(module, {"x": x, "scale": 3.0, "y": y})
    assert list(graph.parameters) == ["frozen", "used", "unused"]
    assert list(graph.gradients) == ["used", "unused"]  # a frozen weight has none
    assert graph.gradients["unused"].target is aten.zeros_like.default  # unused: materialised zeros
    assert len(graph.inputs) == 2 and list(graph.input_gradients) == [0]  # the float is a constant
    assert aten.exp.default not in {n.target for n in graph.order}  # dead code is removed
    params = dict(module.named_parameters())
    loss, grads = graph.gm(params, {}, x, y)
    module(x, 3.0, y).backward()
    torch.testing.assert_close(loss, module(x, 3.0, y))
    torch.testing.assert_close(grads[0], module.used.grad)
    torch.testing.assert_close(grads[2], x.grad)


def test_a_loss_that_is_not_a_scalar_is_refused() -> None:
    with pytest.raises(
        ValueError, match=r"loss: loss_fn must return a floating scalar tensor, got a \(2, 4\)"
    ):
        capture_step(torch.nn.Linear(3, 4), (torch.randn(2, 3),), lambda out: out)


class _DataDependent(torch.nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        return out if out.sum() > 0 else -out  # the branch depends on values fake tensors do not have


def test_a_module_that_cannot_be_traced_on_fake_tensors_raises_a_capture_error() -> None:
    with pytest.raises(
        CaptureError, match="capturing one training step of _DataDependent on fake tensors failed"
    ):
        capture_step(_DataDependent(3, 4), (torch.randn(2, 3),))


class _WithConstants(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(3, 3)
        self.register_buffer("shift", torch.ones(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = torch.tensor([1.0, 2.0, 3.0])  # made from Python data on every call
        return self.linear(x) * scale + self.shift


def test_tensors_the_step_holds_become_constants_passed_with_the_buffers() -> None:
    module, x, targets = _WithConstants(), torch.randn(4, 3), torch.randn(4, 3)
    graph = capture_step(module, (x,), lambda out: F.mse_loss(out, targets))  # targets: held by the loss
    assert not [n for n in graph.gm.graph.nodes if n.op == "get_attr"]
    assert aten.lift_fresh_copy.default not in {n.target for n in graph.order}  # now a clone
    assert list(graph.buffers) == ["shift", *graph.constants]
    assert sorted(tuple(c.shape) for c in graph.constants.values()) == [(3,), (4, 3)]
    assert [n.op for n in graph.buffers.values()] == ["placeholder"] * 3
    params = dict(module.named_parameters())
    loss, grads = graph.gm(params, {**dict(module.named_buffers()), **graph.constants}, x)
    expected = F.mse_loss(module(x), targets)
    expected.backward()
    torch.testing.assert_close(loss, expected)
    for grad, (name, p) in zip(grads, params.items(), strict=True):
        torch.testing.assert_close(grad, p.grad, msg=name)
