"""Built-in models (mlp, gpt2-small, llama3-8b/70b, moe), their capture, and loading users' factories."""

from __future__ import annotations

import math
import pickle
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from strategies.graph.capture import capture_step
from strategies.models import (
    MAX_DIM,
    MAX_ELEMENTS,
    MODELS,
    ModelOptionError,
    ModelSpec,
    build_model,
    load_factory,
    load_model,
    model_layers,
)
from strategies.models.gpt2 import GPT2, GPT2Config
from strategies.models.llama import LlamaConfig
from strategies.models.moe import MoE, MoEConfig, dispatch_slots

SMALL_MOE = MoEConfig(dim=16, n_heads=2, n_kv_heads=1, ffn_dim=24, n_experts=4, top_k=2, vocab_size=40)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_built_in_model_captures_from_meta_with_one_gradient_per_parameter(name: str) -> None:
    spec = build_model(name, batch=2, seq=64, layers=None if name == "mlp" else 2)
    assert all(p.is_meta for p in spec.module.parameters())
    graph = spec.capture()
    assert graph.loss.meta["val"].shape == () and graph.loss.meta["val"].dtype.is_floating_point
    assert list(graph.parameters) == [n for n, _ in spec.module.named_parameters()]
    assert graph.gradients.keys() == graph.parameters.keys()
    for param_name, grad in graph.gradients.items():
        param = graph.parameters[param_name].meta["val"]
        assert grad.op == "call_function", param_name
        assert (grad.meta["val"].shape, grad.meta["val"].dtype) == (param.shape, param.dtype), param_name
    if name == "mlp":
        assert [tuple(x.meta["val"].shape) for x in graph.inputs] == [(2, 1024)] * 2  # input, target
        return
    assert [(tuple(x.meta["val"].shape), x.meta["val"].dtype) for x in graph.inputs] == [
        ((2, 64), torch.int64)
    ] * 2
    layers = {path.split(".")[1] for path in graph.module_path.values() if path.startswith("layers.")}
    assert layers == {"0", "1"}
    # the model computes its loss: forward ops ran inside it, backward ops in autograd's engine
    assert all(n.meta["nn_module_stack"] for n in graph.forward_nodes)
    assert not any(n.meta["nn_module_stack"] for n in graph.backward_nodes)


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("gpt2-small", 124_439_808),
        ("llama3-8b", 8_030_261_248),
        ("llama3-70b", 70_553_706_496),
        ("llama3-405b", 405_853_388_800),
        ("mlp", 8_393_728),
    ],
)
def test_built_in_models_have_their_published_sizes(name: str, params: int) -> None:
    module = build_model(name, batch=1, seq=16).module
    assert sum(p.numel() for p in module.parameters()) == params


def test_parameters_take_the_dtype_and_rope_tables_stay_float32() -> None:
    module = build_model("llama3-8b", batch=1, seq=16, layers=1, dtype=torch.float16).module
    assert {p.dtype for p in module.parameters()} == {torch.float16}
    assert module.rope.dtype == torch.float32
    assert torch.get_default_dtype() == torch.float32  # restored after building


def test_layers_and_options_reshape_the_model_and_seq_beyond_the_tables_extends_them() -> None:
    spec = build_model("llama3-8b", batch=4, seq=16384, layers=3, dim=256, n_heads=8, ffn_dim=512)
    assert len(spec.module.layers) == 3 and spec.module.config.dim == 256
    assert spec.module.rope.shape[1] == 16384
    assert [tuple(x.shape) for x in spec.example_inputs] == [(4, 16384)] * 2
    gpt2 = build_model("gpt2-small", batch=1, seq=2048, layers=1).module
    assert gpt2.wpe.weight.shape == (2048, 768)
    mlp = build_model("mlp", batch=8, seq=1, d=32, h=64)
    assert mlp.module.w1.weight.shape == (64, 32) and mlp.example_inputs[0].shape == (8, 32)


def test_bad_model_arguments_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="unknown model 'gpt5'"):
        build_model("gpt5", batch=1, seq=8)
    with pytest.raises(ValueError, match="width: not an option of llama3-8b"):
        build_model("llama3-8b", batch=1, seq=8, width=3)
    with pytest.raises(ValueError, match="batch: must be a positive integer"):
        build_model("gpt2-small", batch=0, seq=8)
    with pytest.raises(ValueError, match="depth: not an option of mlp"):
        build_model("mlp", batch=1, seq=8, depth=3)
    with pytest.raises(ValueError, match="layers: mlp has exactly two layers"):
        build_model("mlp", batch=1, seq=8, layers=4)
    with pytest.raises(ValueError, match="neither a built-in model"):
        load_model("llama-9")


def test_model_spec_unpacks_like_a_factory_tuple() -> None:
    module, inputs, loss_fn = load_model("mlp", batch=2, seq=1, d=4, h=8)
    assert isinstance(module, torch.nn.Module) and len(inputs) == 2 and loss_fn is None


# -------------------------------------------------------------------------------------- checked options


def _refusal(name: str, **build: Any) -> ModelOptionError:
    """The ModelOptionError ``build_model(name, batch=2, seq=16, **build)`` raises."""
    with pytest.raises(ModelOptionError) as error:
        build_model(name, **{"batch": 2, "seq": 16, **build})
    return error.value


@pytest.mark.parametrize(
    ("name", "option", "value", "got"),
    [
        ("llama3-8b", "n_heads", 0, "0"),
        ("gpt2-small", "vocab_size", 0, "0"),
        ("mlp", "h", -1, "-1"),
        ("mlp", "d", 2**31, "2147483648"),
        ("mlp", "d", 2**70, "an integer of 71 bits"),
        ("moe", "n_experts", True, "True"),
        ("llama3-8b", "dim", 4096.0, "4096.0"),
        ("llama3-8b", "ffn_dim", "14336", "a str"),
    ],
)
def test_an_int_option_takes_an_int_in_1_to_max_dim_and_no_bool_or_float(
    name: str, option: str, value: object, got: str
) -> None:
    error = _refusal(name, **{option: value})
    assert isinstance(error, ValueError) and error.option == option
    assert error.message == f"must be an integer in 1..{MAX_DIM}, got {got}"
    assert str(error) == f"{option}: {error.message}"


@pytest.mark.parametrize(
    ("name", "option", "value", "got"),
    [
        ("llama3-8b", "norm_eps", math.nan, "nan"),
        ("llama3-8b", "rope_theta", math.inf, "inf"),
        ("moe", "capacity_factor", 0.0, "0.0"),
        ("gpt2-small", "norm_eps", -1e-5, "-1e-05"),
        ("moe", "capacity_factor", True, "True"),
        ("llama3-8b", "rope_theta", 10**400, "an integer of 1329 bits"),
    ],
)
def test_a_float_option_takes_a_finite_number_above_zero(
    name: str, option: str, value: object, got: str
) -> None:
    error = _refusal(name, **{option: value})
    assert (error.option, error.message) == (option, f"must be a finite number > 0, got {got}")


def test_a_float_option_takes_an_int() -> None:
    assert (
        build_model("llama3-8b", batch=1, seq=8, layers=1, rope_theta=10000).module.config.rope_theta == 10000
    )


def test_a_bool_option_takes_only_a_bool() -> None:
    error = _refusal("gpt2-small", tie_embeddings=1)
    assert (error.option, error.message) == ("tie_embeddings", "must be true or false, got 1")


@pytest.mark.parametrize(
    ("name", "options", "option", "message"),
    [
        ("llama3-8b", {"n_heads": 33}, "n_heads", "dim (4096) must divide by n_heads (33)"),
        ("gpt2-small", {"n_heads": 7}, "n_heads", "dim (768) must divide by n_heads (7)"),
        (
            "llama3-8b",
            {"dim": 12, "n_heads": 4, "n_kv_heads": 2},
            "n_heads",
            "the head dim dim / n_heads (3) must be even: RoPE rotates pairs",
        ),
        ("llama3-70b", {"n_kv_heads": 5}, "n_kv_heads", "n_heads (64) must divide by n_kv_heads (5)"),
        ("moe", {"top_k": 9}, "top_k", "top_k (9) must be in 1..n_experts (8)"),
    ],
)
def test_a_broken_relation_between_options_names_the_option_that_breaks_it(
    name: str, options: dict[str, int], option: str, message: str
) -> None:
    error = _refusal(name, **options)
    assert (error.option, error.message) == (option, message)


def test_configs_check_themselves_so_no_division_by_zero_is_reached() -> None:
    with pytest.raises(ModelOptionError) as error:
        LlamaConfig(n_heads=0)
    assert error.value.option == "n_heads"
    with pytest.raises(ModelOptionError, match="n_layers: must be an integer"):
        model_layers("moe", n_layers=-2)


def test_an_unknown_option_is_named_with_the_valid_ones() -> None:
    error = _refusal("mlp", depth=3)
    assert (error.option, error.message) == ("depth", "not an option of mlp; options are ['d', 'h']")
    error = _refusal("gpt2-small", width=3)
    assert error.option == "width"
    assert error.message == (
        "not an option of gpt2-small; options are ['dim', 'ffn_dim', 'max_seq_len', 'n_heads', 'n_layers', "
        "'norm_eps', 'tie_embeddings', 'vocab_size']"
    )


@pytest.mark.parametrize(
    ("build", "field", "got"),
    [
        ({"batch": 0}, "batch", "0"),
        ({"seq": MAX_DIM + 1}, "seq", "2147483648"),
        ({"layers": True}, "layers", "True"),
        ({"batch": 2.0}, "batch", "2.0"),
    ],
)
def test_batch_seq_and_layers_are_positive_ints_at_most_max_dim(build: dict, field: str, got: str) -> None:
    with pytest.raises(ValueError) as error:
        build_model("gpt2-small", **{"batch": 2, "seq": 16, **build})
    assert str(error.value) == f"{field}: must be a positive integer at most {MAX_DIM}, got {got}"


@pytest.mark.parametrize(
    ("name", "build", "tensor"),
    [
        ("mlp", {"d": MAX_DIM, "h": MAX_DIM}, "a weight (d x h)"),
        ("llama3-8b", {"batch": MAX_DIM, "seq": MAX_DIM}, "the logits (batch x seq x vocab_size)"),
        ("gpt2-small", {"vocab_size": MAX_DIM, "dim": 2**29, "n_heads": 2**20}, "the token embedding"),
        ("moe", {"capacity_factor": 1e308}, "the dispatch buffer (n_experts x capacity x dim)"),
        (
            "moe",
            {"n_experts": 2**20, "dim": 2**20, "ffn_dim": 2**20, "n_heads": 2**10, "n_kv_heads": 2**10},
            "an expert weight",
        ),
    ],
)
def test_options_whose_tensors_would_overflow_torch_are_refused_before_torch_sees_them(
    name: str, build: dict, tensor: str
) -> None:
    with pytest.raises(ValueError) as error:
        build_model(name, **{"batch": 2, "seq": 16, "layers": None if name == "mlp" else 1, **build})
    text = str(error.value)
    assert text.startswith(f"model: {name} with these options, batch and seq would hold {tensor}")
    assert text.endswith(f"of more than {MAX_ELEMENTS} elements, the most a tensor may have")


def test_the_moe_traced_running_count_bounds_batch_times_seq() -> None:
    """torch's meta cumsum holds a (tokens x top_k)^2 x n_experts intermediate: at MAX_ELEMENTS the step
    still captures; past it the model is refused before torch fails on the size."""
    options = {"dim": 8, "n_heads": 2, "n_kv_heads": 1, "ffn_dim": 8, "vocab_size": 8, "top_k": 1}
    at_bound = build_model("moe", batch=2**15, seq=2**14, layers=1, n_experts=2, **options)
    assert at_bound.capture().loss.meta["val"].shape == ()
    with pytest.raises(ValueError, match=r"the traced running count of the one-hot"):
        build_model("moe", batch=2**15, seq=2**14, layers=1, n_experts=4, **options)


def test_model_option_errors_pickle_with_their_option_and_message() -> None:
    error = pickle.loads(pickle.dumps(ModelOptionError("n_heads", "must be an integer")))
    assert (error.option, error.message, str(error)) == (
        "n_heads",
        "must be an integer",
        "n_heads: must be an integer",
    )


# ----------------------------------------------------------------------------------------------- GPT-2

TINY_GPT2 = GPT2Config(dim=32, n_layers=2, n_heads=4, vocab_size=50, max_seq_len=16, ffn_dim=64)


def test_gpt2_ties_its_output_projection_to_the_token_embedding() -> None:
    torch.manual_seed(0)
    model = GPT2(TINY_GPT2)
    assert model.lm_head.weight is model.wte.weight
    tokens, targets = torch.randint(0, 50, (2, 8)), torch.randint(0, 50, (2, 8))
    graph = capture_step(model, (tokens, targets))
    assert graph.tied == {"wte.weight": ["lm_head.weight"]}
    assert "lm_head.weight" not in graph.parameters and "lm_head.weight" not in graph.gradients
    params = dict(model.named_parameters())
    loss, grads = graph.gm(params, {}, tokens, targets)
    model(tokens, targets).backward()
    torch.testing.assert_close(loss, model(tokens, targets))
    for grad, (name, p) in zip(grads, params.items(), strict=True):  # wte's gradient sums both uses
        torch.testing.assert_close(grad, p.grad, atol=1e-5, rtol=1e-4, msg=name)


def test_gpt2_attention_is_causal_and_logits_match_a_plain_reimplementation() -> None:
    torch.manual_seed(0)
    model = GPT2(TINY_GPT2).eval()
    tokens = torch.randint(0, 50, (1, 6))
    block = model.layers[0]
    x = model.wte(tokens) + model.wpe(torch.arange(6))
    q, k, v = block.attn.c_attn(block.ln_1(x)).split(32, dim=2)
    heads = []
    for h in range(4):
        cut = slice(8 * h, 8 * h + 8)
        scores = q[0, :, cut] @ k[0, :, cut].T / math.sqrt(8)
        scores = scores.masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), float("-inf"))
        heads.append(scores.softmax(-1) @ v[0, :, cut])
    h1 = x + block.attn.c_proj(torch.cat(heads, dim=-1))
    expected = h1 + block.mlp.c_proj(F.gelu(block.mlp.c_fc(block.ln_2(h1)), approximate="tanh"))
    torch.testing.assert_close(block(x), expected, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------------- mixture of experts


def _reference_moe(moe: MoE, x: torch.Tensor) -> torch.Tensor:
    """Token by token: first choices claim expert slots before second choices; past capacity is dropped."""
    config = moe.config
    tokens = x.reshape(-1, config.dim)
    scores = moe.router(tokens).float().softmax(-1)
    weights, experts = scores.topk(config.top_k, dim=-1)
    weights = weights / weights.sum(-1, keepdim=True)
    capacity, used = config.capacity(len(tokens)), [0] * config.n_experts
    out = torch.zeros_like(tokens)
    for choice in range(config.top_k):
        for t in range(len(tokens)):
            e = int(experts[t, choice])
            used[e] += 1
            if used[e] > capacity:
                continue
            hidden = F.silu(tokens[t] @ moe.w1[e]) * (tokens[t] @ moe.w3[e])
            out[t] += weights[t, choice] * (hidden @ moe.w2[e])
    return out.view_as(x)


@pytest.mark.parametrize("capacity_factor", [4.0, 0.5])
def test_moe_routes_each_token_to_its_top_k_experts_up_to_capacity(capacity_factor: float) -> None:
    torch.manual_seed(0)
    moe = MoE(SMALL_MOE.replace(capacity_factor=capacity_factor))
    x = torch.randn(2, 12, 16)
    torch.testing.assert_close(moe(x), _reference_moe(moe, x), atol=1e-5, rtol=1e-5)


def test_dispatch_slots_give_first_choices_priority_and_drop_past_capacity() -> None:
    experts = torch.tensor([[0, 1], [0, 2], [0, 1]])  # three tokens; capacity 2 per expert
    slot, kept = dispatch_slots(experts, n_experts=3, capacity=2)
    # choice-major: first choices 0, 0, 0 (the third is dropped), then second choices 1, 2, 1
    assert kept.tolist() == [True, True, False, True, True, True]
    assert slot.tolist() == [0, 1, 0, 2, 4, 3]


def test_moe_gradients_match_eager_autograd_when_tokens_are_dropped() -> None:
    torch.manual_seed(0)
    moe = MoE(SMALL_MOE.replace(capacity_factor=0.5))
    x = torch.randn(2, 12, 16, requires_grad=True)
    graph = capture_step(moe, (x,), lambda out: out.pow(2).sum())
    params = dict(moe.named_parameters())
    _, grads = graph.gm(params, {}, x)
    moe(x).pow(2).sum().backward()
    for grad, (name, p) in zip(grads, [*params.items(), ("x", x)], strict=True):
        torch.testing.assert_close(grad, p.grad, atol=1e-5, rtol=1e-4, msg=name)
    experts_ops = {str(n.target) for n in graph.order if graph.module_path.get(n.name) == ""}
    assert "aten.bmm.default" in experts_ops and "aten.embedding_dense_backward.default" in experts_ops


def test_moe_capacity_is_the_even_share_times_the_capacity_factor() -> None:
    assert MoEConfig().capacity(16 * 8192) == math.ceil(1.25 * 16 * 8192 * 2 / 8)
    with pytest.raises(ValueError, match="top_k"):
        MoEConfig(top_k=9)


# -------------------------------------------------------------------------------------------- factories


def _factory_file(tmp_path: Path, body: str, name: str = "model.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


HF_STYLE = """
    from dataclasses import dataclass

    import torch
    from torch import nn

    from helper import WIDTH  # a sibling module: the factory's folder is importable


    @dataclass
    class Output:
        loss: torch.Tensor
        logits: torch.Tensor


    class Classifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Linear(WIDTH, 3)

        def forward(self, features, labels=None):
            logits = self.body(features)
            return Output(loss=nn.functional.cross_entropy(logits, labels), logits=logits)


    def make():
        return Classifier(), {"features": torch.randn(4, WIDTH), "labels": torch.tensor([0, 1, 2, 0])}


    def make_with_loss():
        return nn.Linear(WIDTH, 2), (torch.randn(4, WIDTH),), lambda out: out.pow(2).mean()


    not_a_function = 3


    def broken():
        raise RuntimeError("no GPU here")


    def wrong_arity():
        return (nn.Linear(2, 2),)


    def wrong_module():
        return "model", (torch.ones(1),)


    def wrong_inputs():
        return nn.Linear(2, 2), 5


    def wrong_loss():
        return nn.Linear(2, 2), (torch.ones(1, 2),), "mse"
"""


@pytest.fixture
def factory_file(tmp_path: Path) -> Path:
    _factory_file(tmp_path, "WIDTH = 5\n", "helper.py")
    return _factory_file(tmp_path, HF_STYLE)


def test_a_factory_with_a_hugging_face_style_output_uses_its_loss(factory_file: Path) -> None:
    spec = load_model(f"{factory_file}:make")
    assert isinstance(spec, ModelSpec) and spec.loss_fn is None
    graph = spec.capture()
    assert graph.loss.args[0].target is torch.ops.aten.nll_loss_forward.default  # (loss, total_weight)[0]
    assert [tuple(x.meta["val"].shape) for x in graph.inputs] == [(4, 5), (4,)]  # keyword inputs, in order
    params = dict(spec.module.named_parameters())
    loss, _ = graph.gm(params, {}, *spec.example_inputs.values())
    torch.testing.assert_close(loss, spec.module(**spec.example_inputs).loss)


def test_a_factory_may_return_its_loss_function(factory_file: Path) -> None:
    spec = load_factory(f"{factory_file}:make_with_loss")
    graph = spec.capture()
    assert graph.gradients.keys() == {"weight", "bias"}
    assert str(graph.loss.target) == "aten.mean.default"


@pytest.mark.parametrize(
    ("function", "message"),
    [
        ("missing", "has no function 'missing'"),
        ("not_a_function", "is a int, not a function"),
        ("broken", r"broken\(\) raised RuntimeError: no GPU here"),
        ("wrong_arity", "must return .* got a tuple of 1"),
        ("wrong_module", "returned a str as module"),
        ("wrong_inputs", "returned a int as example_inputs"),
        ("wrong_loss", "returned a str as loss_fn"),
    ],
)
def test_a_bad_factory_is_refused_naming_the_problem(factory_file: Path, function: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_factory(f"{factory_file}:{function}")


def test_a_bad_factory_path_is_refused_naming_the_problem(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"file '.*nowhere\.py' not found"):
        load_factory(f"{tmp_path}/nowhere.py:make")
    with pytest.raises(ValueError, match=r"expected path/file\.py:factory"):
        load_factory("model.py")
    broken = _factory_file(tmp_path, "import not_a_module\n", "broken.py")
    with pytest.raises(ValueError, match=r"importing .*broken\.py' raised ModuleNotFoundError"):
        load_factory(f"{broken}:make")
