"""Attention, ``_scaled_mm``, ``_grouped_mm`` and ``constant_pad_nd``.

Ops that run on CPU (the ``_for_cpu`` SDPA kernels through :mod:`strategies.ops.dtensor_bridge`, float8
``_scaled_mm``, bf16 ``_grouped_mm``, ``constant_pad_nd``): every strategy runs in DTensor on 4 gloo ranks as
predicted (meshes (4,) and (2, 2)). The CUDA-only flash, efficient and cudnn kernels: our strategies equal
the ones DTensor's own sharding propagator lists for them, on meshes without ranks.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from strategies.cost.mesh import make_mesh
from strategies.ops.dtensor_bridge import BRIDGED_OPS, dtensor_strategy, register_with_dtensor
from strategies.ops.generate import op_strategies
from strategies.ops.registry import lookup
from strategies.placement import NONE, P, from_dtensor
from strategies.tensor_meta import TensorMeta as T
from tests.strategies.ops.conformance import MESHES, Case, Fixed, Ints, gloo  # noqa: F401

aten = torch.ops.aten
BF16, F8 = torch.bfloat16, torch.float8_e4m3fn
CPU_SDPA = "aten._scaled_dot_product_flash_attention_for_cpu.default"
CPU_SDPA_BACKWARD = "aten._scaled_dot_product_flash_attention_for_cpu_backward.default"


def _sdpa_backward(q: T, kv: T, *flags: Any, **kwargs: Any) -> Case:
    """The CPU backward on saved tensors shaped like q, k, v (values random: the op is checked, not SDPA)."""
    lse = T(q.shape[:3])
    return Case(CPU_SDPA_BACKWARD, (q, q, kv, kv, q, lse, 0.0, *flags), kwargs)


Q, GQA_Q, KV = T((4, 4, 8, 16)), T((4, 8, 8, 16)), T((4, 4, 8, 16))
BF16_TOL = {"atol": 0.5, "rtol": 0.05}

BOTH, LINE = MESHES, MESHES[:1]
CASES: dict[str, tuple[Case, tuple]] = {
    "sdpa": (Case(CPU_SDPA, (Q, KV, KV)), BOTH),
    "sdpa-gqa-causal": (Case(CPU_SDPA, (GQA_Q, KV, KV, 0.0, True)), BOTH),
    "sdpa-cross-causal": (
        Case(CPU_SDPA, (T((4, 4, 6, 16)), T((4, 4, 10, 16)), T((4, 4, 10, 16)), 0.0, True)),
        LINE,
    ),
    "sdpa-mask-scale": (Case(CPU_SDPA, (Q, KV, KV), {"attn_mask": T((4, 4, 8, 8)), "scale": 0.3}), BOTH),
    "sdpa-mask-broadcast": (Case(CPU_SDPA, (Q, KV, KV), {"attn_mask": T((4, 1, 8, 8))}), LINE),
    "sdpa-mask-2d": (Case(CPU_SDPA, (GQA_Q, KV, KV), {"attn_mask": T((8, 8))}), LINE),
    "sdpa-batch-6": (Case(CPU_SDPA, (T((6, 4, 8, 16)), T((6, 4, 8, 16)), T((6, 4, 8, 16)))), BOTH),
    "sdpa-backward": (_sdpa_backward(Q, KV, False), BOTH),
    "sdpa-backward-causal-scale": (_sdpa_backward(Q, KV, True, scale=0.3), LINE),
    "sdpa-backward-gqa": (_sdpa_backward(GQA_Q, KV, True), BOTH),
    "sdpa-backward-mask": (_sdpa_backward(Q, KV, False, attn_mask=T((1, 4, 8, 8))), BOTH),
    "scaled-mm-tensorwise": (
        Case(
            "aten._scaled_mm.default",
            (T((16, 32), F8), T((32, 64), F8), T(()), T(())),
            {"out_dtype": torch.float32},
        ),
        BOTH,
    ),
    "scaled-mm-rowwise": (
        Case(
            "aten._scaled_mm.default",
            (T((16, 32), F8), T((32, 64), F8), T((16, 1)), T((1, 64))),
            {"out_dtype": torch.float32},
        ),
        BOTH,
    ),
    "scaled-mm-bf16-out": (
        Case(
            "aten._scaled_mm.default",
            (T((16, 32), F8), T((32, 64), F8), T(()), T(())),
            {"out_dtype": BF16},
            **BF16_TOL,
        ),
        LINE,
    ),
    # offs: four groups of equal size along the grouped dim
    "grouped-mm-2dx3d": (
        Case(
            "aten._grouped_mm.default",
            (T((32, 64), BF16), T((4, 64, 64), BF16), Fixed((8, 16, 24, 32), torch.int32)),
            **BF16_TOL,
        ),
        BOTH,
    ),
    "grouped-mm-3dx2d": (
        Case(
            "aten._grouped_mm.default",
            (T((4, 32, 64), BF16), T((64, 64), BF16), Fixed((16, 32, 48, 64), torch.int32)),
            **BF16_TOL,
        ),
        LINE,
    ),
    "grouped-mm-2dx2d": (
        Case(
            "aten._grouped_mm.default",
            (T((32, 64), BF16), T((64, 64), BF16), Fixed((16, 32, 48, 64), torch.int32)),
            **BF16_TOL,
        ),
        LINE,
    ),
    "grouped-mm-3dx3d": (
        Case("aten._grouped_mm.default", (T((4, 32, 64), BF16), T((4, 64, 64), BF16)), **BF16_TOL),
        BOTH,
    ),
    "pad-zero": (Case("aten.constant_pad_nd.default", (T((8, 6, 4)), [1, 2])), BOTH),
    "pad-value": (Case("aten.constant_pad_nd.default", (T((8, 6, 4)), [1, 1, 0, 0], 0.5)), BOTH),
    "pad-none": (Case("aten.constant_pad_nd.default", (T((8, 6, 4)), [0, 0, 0, 0], 1.0)), LINE),
    "pad-crop": (Case("aten.constant_pad_nd.default", (T((8, 6, 4)), [0, 0, -1, 2])), LINE),
}
"""Per case the meshes it runs on: the 2x2 mesh where placements combine across axes in new ways."""


@pytest.mark.parametrize(
    ("name", "mesh_shape"),
    [(name, mesh) for name, (_, meshes) in CASES.items() for mesh in meshes],
    ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else v,
)
def test_every_strategy_runs_as_predicted(gloo, name: str, mesh_shape: tuple[int, ...]) -> None:  # noqa: F811
    failures = gloo.check(CASES[name][0], mesh_shape)
    assert not failures, "\n".join(failures)


# ------------------------------------------------------------------------------------- without ranks


def _inputs(strategies: Any, index: int) -> tuple:
    return tuple(tuple(int(c) for c in spec) for spec in strategies.input_specs[index])


def test_attention_shards_batch_and_heads_only() -> None:
    strategies = op_strategies(
        aten._scaled_dot_product_flash_attention_for_cpu.default, (Q, KV, KV), {}, make_mesh((4,))
    )
    assert {_inputs(strategies, i) for i in range(len(strategies))} == {
        ((-1,),) * 3,
        ((0,),) * 3,
        ((1,),) * 3,
    }


def test_gqa_heads_cut_only_where_kv_heads_split_evenly() -> None:
    q, kv = T((2, 12, 8, 16)), T((2, 6, 8, 16))
    one_axis = op_strategies(
        aten._scaled_dot_product_flash_attention_for_cpu.default, (q, kv, kv), {}, make_mesh((4,))
    )
    assert all(1 not in spec for i in range(len(one_axis)) for spec in _inputs(one_axis, i))
    two_axes = op_strategies(
        aten._scaled_dot_product_flash_attention_for_cpu.default, (q, kv, kv), {}, make_mesh((2, 2))
    )
    heads = {_inputs(two_axes, i)[1] for i in range(len(two_axes)) if 1 in _inputs(two_axes, i)[1]}
    assert heads == {(1, -1), (-1, 1), (1, 0), (0, 1)}


def test_cpu_attention_flops_are_flash_attentions() -> None:
    from torch.utils.flop_counter import flop_registry

    qkv = [GQA_Q.shape, KV.shape, KV.shape]
    cpu_forward = lookup(aten._scaled_dot_product_flash_attention_for_cpu.default).flops
    cpu_backward = lookup(aten._scaled_dot_product_flash_attention_for_cpu_backward.default).flops
    flash_forward = flop_registry[aten._scaled_dot_product_flash_attention]
    flash_backward = flop_registry[aten._scaled_dot_product_flash_attention_backward]
    forward = cpu_forward(None, qkv, [])
    assert forward == flash_forward(*qkv, out_val=None) > 0
    assert cpu_backward(None, [GQA_Q.shape, *qkv], []) == flash_backward(GQA_Q.shape, *qkv, out_val=None)


def test_scaled_mm_never_splits_k_into_a_float8_output_or_a_blockwise_scale() -> None:
    mesh = make_mesh((4,))
    a, b = T((16, 32), F8), T((32, 64), F8)
    fp8_out = op_strategies(aten._scaled_mm.default, (a, b, T(()), T(())), {}, mesh)
    assert P not in fp8_out.output_specs
    blockwise_scales = (a, b, T((16,)), T((64,)))  # one scale per 32-element block along K
    blockwise = op_strategies(
        aten._scaled_mm.default, blockwise_scales, {"out_dtype": BF16}, mesh, outputs=(T((16, 64), BF16),)
    )
    described = [blockwise.describe(i)["inputs"] for i in range(len(blockwise))]
    assert described == [[["R"]] * 4, [["S(0)"], ["R"], ["S(0)"], ["R"]], [["R"], ["S(1)"], ["R"], ["S(0)"]]]


def test_grouped_mm_never_cuts_the_grouped_dim() -> None:
    offs = T((4,), torch.int32)
    strategies = op_strategies(
        aten._grouped_mm.default, (T((32, 64), BF16), T((4, 64, 64), BF16), offs), {}, make_mesh((4,))
    )
    self_codes = {int(strategies.input_specs[i, 0, 0]) for i in range(len(strategies))}
    assert 0 not in self_codes and {1, P} <= self_codes


def test_bridge_registers_once_and_lists_our_strategies() -> None:
    from torch.distributed.tensor import DTensor

    register_with_dtensor()
    register_with_dtensor()
    funcs = DTensor._op_dispatcher.sharding_propagator.op_strategy_funcs
    assert all(funcs[op] is dtensor_strategy for op in BRIDGED_OPS)
    ours, theirs = _both(
        aten._scaled_dot_product_flash_attention_for_cpu.default, (GQA_Q, KV, KV), {}, (2, 2)
    )
    assert ours == theirs and len(ours) == 9


def test_bridge_keeps_keyword_tensors_where_they_are() -> None:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor._op_schema import OpSchema

    op, mesh = aten._scaled_dot_product_flash_attention_for_cpu.default, _rankless_mesh((4,))
    mask = T((4, 4, 8, 8))
    for placement, expected in ((Shard(1), {(1,)}), (Replicate(), {(-1,)})):
        schema = OpSchema(op, _replicated((Q, KV, KV), mesh), {"attn_mask": _placed(mask, mesh, placement)})
        strategy = dtensor_strategy(schema)
        assert {from_dtensor(s.input_specs[0].placements) for s in strategy.strategies} == expected
    schema = OpSchema(op, _replicated((Q, KV, KV), mesh), {"attn_mask": _placed(mask, mesh, Shard(2))})
    with pytest.raises(ValueError, match="attn_mask"):
        dtensor_strategy(schema)


# The CUDA kernels: our strategies are DTensor's (compared on every output that holds data).
SEED, RNG = T((), torch.int64), T((2,), torch.uint64)
BIAS, EFFICIENT_LSE, CUDNN_LSE = T((4, 4, 8, 8)), T((4, 4, 32)), T((4, 4, 8, 1))
FLASH = aten._scaled_dot_product_flash_attention.default
EFFICIENT = aten._scaled_dot_product_efficient_attention.default
CUDNN = aten._scaled_dot_product_cudnn_attention.default
SAVED = (Q, Q, KV, KV)  # grad_out, query, key, value
CUDA_CASES = {
    "flash": (FLASH, (Q, KV, KV)),
    "flash-gqa-debug-mask": (FLASH, (GQA_Q, KV, KV, 0.0, True, True)),
    "flash-backward": (
        aten._scaled_dot_product_flash_attention_backward.default,
        (*SAVED, Q, T((4, 4, 8)), None, None, 8, 8, 0.0, False, RNG, T((), torch.uint64)),
    ),
    "efficient": (EFFICIENT, (Q, KV, KV, None, True)),
    "efficient-no-lse": (EFFICIENT, (Q, KV, KV, None, False)),
    "efficient-bias": (EFFICIENT, (Q, KV, KV, BIAS, True, 0.0, True)),
    "efficient-backward": (
        aten._scaled_dot_product_efficient_attention_backward.default,
        (*SAVED, None, Q, EFFICIENT_LSE, SEED, SEED, 0.0, [True, True, True, False]),
    ),
    "efficient-backward-bias": (
        aten._scaled_dot_product_efficient_attention_backward.default,
        (*SAVED, BIAS, Q, EFFICIENT_LSE, SEED, SEED, 0.0, [True, True, True, True]),
    ),
    "cudnn": (CUDNN, (Q, KV, KV, None, True)),
    "cudnn-no-lse-debug": (CUDNN, (Q, KV, KV, None, False, 0.0, True, True)),
    "cudnn-backward": (
        aten._scaled_dot_product_cudnn_attention_backward.default,
        (*SAVED, Q, CUDNN_LSE, SEED, SEED, None, None, None, 8, 8, 0.0, False),
    ),
    "cudnn-backward-bias": (
        aten._scaled_dot_product_cudnn_attention_backward.default,
        (*SAVED, Q, CUDNN_LSE, SEED, SEED, BIAS, None, None, 8, 8, 0.0, False),
    ),
}
"""DTensor's cudnn forward with a bias is left out: its rules give the bias a placement only when
replicated, and its own expansion then fails (``input_specs(3) != strategies(4)``)."""


@pytest.mark.parametrize("mesh_shape", MESHES, ids=lambda m: "x".join(map(str, m)))
@pytest.mark.parametrize("name", list(CUDA_CASES))
def test_cuda_attention_strategies_are_dtensors(name: str, mesh_shape: tuple[int, ...]) -> None:
    op, args = CUDA_CASES[name]
    ours, theirs = _both(op, args, {}, mesh_shape)
    assert ours == theirs, f"only ours: {sorted(ours - theirs)}\nonly DTensor's: {sorted(theirs - ours)}"
    assert len(ours) == 3 ** len(mesh_shape)


def test_uneven_attention_cuts_are_a_subset_of_dtensors() -> None:
    q = T((6, 4, 8, 16))
    ours, theirs = _both(aten._scaled_dot_product_flash_attention.default, (q, q, q), {}, (4,))
    assert ours < theirs


def _both(op: Any, args: tuple, kwargs: dict, mesh_shape: tuple[int, ...]) -> tuple[set, set]:
    """(inputs, outputs) placements of our strategies and of DTensor's, on a mesh without ranks.

    Outputs are compared where ours hold data (RNG state, philox scalars and empty placeholders are left out:
    DTensor marks some of them ``None``).
    """
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._op_schema import OpSchema

    ours = op_strategies(op, args, kwargs, make_mesh(mesh_shape))
    compared = [k for k, m in enumerate(ours.outputs) if m is not None and m.ndim > 0 and m.numel > 0]
    mine = {
        (_inputs(ours, i), tuple(tuple(int(c) for c in ours.output_specs[i, k]) for k in compared))
        for i in range(len(ours))
    }
    mesh = _rankless_mesh(mesh_shape)
    schema = OpSchema(op, _replicated(args, mesh), _replicated(kwargs, mesh))
    strategy = DTensor._op_dispatcher.sharding_propagator.op_strategy_funcs[op](schema)
    theirs = set()
    for spec in strategy.strategies:
        outputs = spec.output_specs if isinstance(spec.output_specs, tuple) else (spec.output_specs,)
        inputs = tuple(from_dtensor(s.placements) for s in spec.input_specs)
        picked = tuple(
            (NONE,) * len(mesh_shape) if outputs[k] is None else from_dtensor(outputs[k].placements)
            for k in compared
        )
        theirs.add((inputs, picked))
    return mine, theirs


def _rankless_mesh(mesh_shape: tuple[int, ...]) -> Any:
    from torch.distributed.device_mesh import DeviceMesh

    ranks = torch.arange(math.prod(mesh_shape)).reshape(mesh_shape)
    return DeviceMesh("cpu", ranks, _init_backend=False, _rank=0)


def _placed(meta: T, mesh: Any, placement: Any) -> Any:
    """A tensor as DTensor sees it while propagating: an ``OpStrategy`` of its one placement on every axis."""
    from torch.distributed.tensor._dtensor_spec import DTensorSpec
    from torch.distributed.tensor._dtensor_spec import TensorMeta as TorchMeta
    from torch.distributed.tensor._op_schema import OpSpec, OpStrategy

    t = torch.empty(meta.shape, dtype=meta.dtype, device="meta")
    spec = DTensorSpec(mesh, (placement,) * mesh.ndim, tensor_meta=TorchMeta(t.shape, t.stride(), t.dtype))
    return OpStrategy([OpSpec(spec)])


def _replicated(tree: Any, mesh: Any) -> Any:
    """Arguments as DTensor sees them while propagating: every tensor replicated."""
    from torch.distributed.tensor import Replicate

    if isinstance(tree, T):
        return _placed(tree, mesh, Replicate())
    if isinstance(tree, (list, tuple)) and any(isinstance(t, T) for t in tree):
        return type(tree)(_replicated(t, mesh) for t in tree)
    if isinstance(tree, dict):
        return {k: _replicated(v, mesh) for k, v in tree.items()}
    return tree
