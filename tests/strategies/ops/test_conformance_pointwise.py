"""Pointwise ops: every strategy runs in DTensor on 4 gloo ranks as predicted (meshes (4,) and (2, 2))."""

from __future__ import annotations

import pytest
import torch

from strategies.cost.mesh import make_mesh
from strategies.ops.generate import op_strategies
from strategies.ops.pointwise_ops import broadcast_dim, cast_keeps_sums, pointwise_rules
from strategies.ops.registry import OpInfo
from strategies.placement import P, R
from strategies.tensor_meta import TensorMeta as T
from strategies.tensor_meta import flatten_tensors, meta_outputs
from tests.strategies.ops.conformance import MESHES, Case, gloo, resolve_op  # noqa: F401

aten = torch.ops.aten
BF16 = torch.bfloat16
BOOL = torch.bool

X = T((8, 6))
"""A (8, 6) activation: dim 1 splits unevenly over 4 ranks."""

CASES = [
    # linear, with broadcasting (a missing dim, a size-1 dim, a 0-d tensor)
    Case("aten.add.Tensor", (X, T((6,)))),
    Case("aten.add.Tensor", (T((4, 1, 6)), T((8, 1))), {"alpha": 2}),
    Case("aten.sub.Tensor", (X, X)),
    Case("aten.add.Tensor", (X, 1.5)),
    Case("aten.mul.Tensor", (X, T((8, 1)))),
    Case("aten.mul.Tensor", (X, T(()))),
    Case("aten.mul.Tensor", (X, 3.0)),
    Case("aten.div.Tensor", (X, T((6,)))),
    Case("aten.mul.Scalar", (X, 0.5)),
    Case("aten.div.Scalar", (X, 4.0)),
    Case("aten.neg.default", (X,)),
    # nonlinear unary and binary
    Case("aten.add.Scalar", (X, 2.0)),
    Case("aten.sub.Scalar", (X, 2.0)),
    Case("aten.rsub.Scalar", (X, 2.0)),
    Case("aten.exp.default", (X,)),
    Case("aten.log.default", (X,)),
    Case("aten.sqrt.default", (X,)),
    Case("aten.rsqrt.default", (X,)),
    Case("aten.pow.Tensor_Scalar", (X, 2)),
    Case("aten.pow.Tensor_Tensor", (X, T((6,)))),
    Case("aten.tanh.default", (X,)),
    Case("aten.sigmoid.default", (X,)),
    Case("aten.relu.default", (X,)),
    Case("aten.abs.default", (X,)),
    Case("aten.reciprocal.default", (X,)),
    Case("aten.clamp.default", (X, -0.5, 0.5)),
    Case("aten.clamp.Tensor", (X, T((6,)), T((8, 1)))),
    Case("aten.pow.Scalar", (2.0, X)),
    Case("aten.gelu.default", (X,)),
    Case("aten.gelu.default", (X,), {"approximate": "tanh"}),
    Case("aten.silu.default", (T((2, 4, 6), BF16),), atol=0.02, rtol=0.02),
    # selection and comparison
    Case("aten.where.self", (T((8, 1), BOOL), X, T((6,)))),
    Case("aten.masked_fill.Scalar", (X, T((1, 6), BOOL), -1e4)),
    Case("aten.masked_fill.Tensor", (X, T((8, 6), BOOL), T(()))),
    Case("aten.eq.Scalar", (X, 0.0)),
    Case("aten.ne.Tensor", (X, T((6,)))),
    Case("aten.lt.Scalar", (X, 0.0)),
    Case("aten.gt.Tensor", (X, X)),
    Case("aten.ge.Scalar", (X, 0.0)),
    Case("aten.le.Tensor", (X, T((8, 1)))),
    Case("aten.logical_not.default", (T((8, 6), BOOL),)),
    Case("aten.logical_and.default", (T((8, 6), BOOL), T((6,), BOOL))),
    Case("aten.logical_or.default", (T((8, 6), BOOL), T((8, 1), BOOL))),
    Case("aten.bitwise_and.Tensor", (T((8, 6), BOOL), T((8, 6), BOOL))),
    Case("aten.bitwise_xor.Tensor", (T((8, 6), torch.int32), T((6,), torch.int32))),
    Case("aten.bitwise_not.default", (T((8, 6), BOOL),)),
    # backward of activations
    Case("aten.gelu_backward.default", (X, X)),
    Case("aten.silu_backward.default", (X, X)),
    Case("aten.threshold_backward.default", (X, X, 0.0)),
    Case("aten.sigmoid_backward.default", (X, X)),
    Case("aten.tanh_backward.default", (X, X)),
    # dropout
    Case("aten.native_dropout.default", (X, 0.5, True), check_values=False),
    Case("aten.native_dropout.default", (T((4, 8, 8), BF16), 0.1, True), check_values=False),
    Case("aten.native_dropout_backward.default", (X, T((8, 6), BOOL), 2.0)),
    Case("aten.bernoulli_.float", (X, 0.5), check_values=False),
    # copies, casts, in-place
    Case("aten.clone.default", (X,)),
    Case("aten.detach.default", (X,)),
    Case("aten.alias.default", (X,)),
    Case("aten._to_copy.default", (X,), {"dtype": BF16}, atol=0.05, rtol=0.02),
    Case("aten._to_copy.default", (T((8, 6), BF16),), {"dtype": torch.float32}, atol=0.05, rtol=0.02),
    Case("aten._to_copy.default", (X,), {"dtype": torch.int64}),
    Case("aten.copy_.default", (X, T((6,)))),
    Case("aten.fill_.Scalar", (X, 3.0)),
    # 3-D, bf16, every dim shardable
    # (random partial splits of a bf16 value round each piece: a looser tolerance)
    Case("aten.add.Tensor", (T((4, 8, 8), BF16), T((4, 8, 8), BF16)), atol=0.15, rtol=0.05),
    Case("aten.mul.Tensor", (T((4, 8, 8), BF16), T((8,), BF16)), atol=0.15, rtol=0.05),
]


@pytest.mark.parametrize("mesh_shape", MESHES, ids=lambda m: "x".join(map(str, m)))
@pytest.mark.parametrize("case", CASES, ids=str)
def test_every_strategy_runs_as_predicted(gloo, case: Case, mesh_shape: tuple[int, ...]) -> None:  # noqa: F811
    failures = gloo.check(case, mesh_shape)
    assert not failures, "\n".join(failures)


# ----------------------------------------------------------------------------- the shared generator


def rules(op: str, *args, **kwargs) -> list[list[int]]:
    overload = resolve_op(op)
    info = OpInfo(overload, args, kwargs, tuple(flatten_tensors(args)), meta_outputs(overload, args, kwargs))
    return [list(row) for row in pointwise_rules(info)]


def test_a_broadcast_or_missing_dim_stays_whole() -> None:
    assert broadcast_dim((6,), (8, 6), 1) == 0
    assert broadcast_dim((6,), (8, 6), 0) is None
    assert broadcast_dim((8, 1), (8, 6), 1) is None
    assert rules("aten.add.Tensor", T((4, 1, 6)), T((8, 1))) == [[0, 0, R], [1, R, 0], [2, 2, R]]


def test_linear_groups_need_every_named_tensor() -> None:
    def count(op: str, *args) -> int:
        return len(op_strategies(resolve_op(op), args, {}, make_mesh((4,))))

    # R, S(0), S(1) and P; adding a number to a partial value would add it once per rank.
    assert count("aten.add.Tensor", X, X) == 4
    assert count("aten.add.Tensor", X, 1.0) == 3
    # mul: P through either factor (two rows), or through the only tensor.
    assert count("aten.mul.Tensor", X, X) == 5
    assert count("aten.mul.Tensor", X, 2.0) == 4
    assert count("aten.exp.default", X) == 3
    # 2-D mesh: the product of the single-axis rows (16 for add: 4 x 4).
    assert len(op_strategies(aten.add.Tensor, (X, X), {}, make_mesh((2, 2)))) == 16


def test_partial_rows_put_r_on_the_other_factor() -> None:
    info = OpInfo(aten.mul.Tensor, (X, X), {}, (X, X), (X,))
    assert [list(r) for r in pointwise_rules(info, linear_in=[(0,), (1,)])][-2:] == [[P, P, R], [P, R, P]]


def test_a_cast_keeps_partial_sums_unless_it_rounds_to_integers() -> None:
    assert cast_keeps_sums(T((2,), torch.float32), torch.bfloat16)
    assert cast_keeps_sums(T((2,), torch.int64), torch.float32)
    assert cast_keeps_sums(T((2,)), None)
    assert not cast_keeps_sums(T((2,), torch.float32), torch.int64)
    assert not cast_keeps_sums(T((2,), torch.float32), torch.bool)
