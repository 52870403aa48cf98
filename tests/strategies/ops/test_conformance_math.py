"""Reductions, softmax, norms and nll_loss: every strategy runs in DTensor on 4 gloo ranks as predicted."""

from __future__ import annotations

import pytest
import torch

from strategies.cost.mesh import make_mesh
from strategies.ops.generate import op_strategies
from strategies.ops.math_ops import batch_dim_rules, reduced_dims, reduction_rules
from strategies.placement import P, R, spec_text
from strategies.tensor_meta import TensorMeta as T
from tests.strategies.ops.conformance import MESHES, Case, Ints, gloo, resolve_op  # noqa: F401

aten = torch.ops.aten
BF16 = torch.bfloat16
BOOL = torch.bool

X = T((8, 6))
"""Dim 1 (6) splits unevenly over 4 ranks."""
A = T((4, 6, 8))
"""An activation ``[batch, sequence, hidden]``."""
STATS = T((4, 6, 1))
LOGITS, TARGET = T((8, 5)), Ints((8,), 5)
BF16_TOL = {"atol": 0.05, "rtol": 0.05}

CASES = [
    # linear reductions: a sharded reduced dim gives a partial output
    Case("aten.sum.default", (X,)),
    Case("aten.sum.dim_IntList", (X, [1])),
    Case("aten.sum.dim_IntList", (A, [-1], True)),
    Case("aten.sum.dim_IntList", (A, [0, 2])),
    Case("aten.sum.dim_IntList", (T((4, 8, 8), BF16), [1]), **BF16_TOL),
    Case("aten.sum.dim_IntList", (T((8, 8)), [])),
    Case("aten.mean.dim", (T((8, 8)), [])),
    Case("aten.amax.default", (T((8, 8)), [])),
    Case("aten.any.dims", (T((8, 8), BOOL), [])),
    Case("aten.var.correction", (T((8, 8)), [])),
    Case("aten.mean.default", (T((8, 8)),)),
    Case("aten.mean.dim", (A, [-1], True)),
    Case("aten.mean.dim", (X, [0])),
    Case("aten.amax.default", (X, [1])),
    Case("aten.amax.default", (A, [0], True)),
    Case("aten.amin.default", (T((4, 8, 8)), [1, 2])),
    Case("aten.max.default", (X,)),
    Case("aten.min.default", (X,)),
    # reductions that keep the reduced dim whole
    Case("aten.max.dim", (X, 1)),
    Case("aten.max.dim", (A, -2, True)),
    Case("aten.min.dim", (X, 0)),
    Case("aten.var.correction", (X, [1]), {"correction": 1, "keepdim": True}),
    Case("aten.std.correction", (A, [0]), {"correction": 0}),
    Case("aten.any.dim", (T((8, 6), BOOL), 1)),
    Case("aten.all.dim", (T((8, 6), BOOL), 0, True)),
    Case("aten.argmax.default", (X, 1)),
    Case("aten.argmin.default", (A, 0, True)),
    # softmax
    Case("aten._softmax.default", (A, -1, False)),
    Case("aten._log_softmax.default", (X, 1, False)),
    Case("aten._safe_softmax.default", (T((2, 4, 8, 8)), -1)),
    Case("aten._softmax.default", (T((4, 8, 8), BF16), 2, False), **BF16_TOL),
    Case("aten._softmax_backward_data.default", (A, A, -1, torch.float32)),
    Case("aten._log_softmax_backward_data.default", (X, X, 0, torch.float32)),
    # layer norm and rms norm
    Case("aten.native_layer_norm.default", (A, [8], T((8,)), T((8,)), 1e-5)),
    Case("aten.native_layer_norm.default", (X, [6], None, None, 1e-5)),
    Case("aten.native_layer_norm.default", (A, [6, 8], T((6, 8)), T((6, 8)), 1e-5)),
    Case("aten.native_layer_norm.default", (T((4, 8, 8), BF16), [8], T((8,), BF16), None, 1e-5), **BF16_TOL),
    Case(
        "aten.native_layer_norm_backward.default",
        (A, A, [8], STATS, STATS, T((8,)), T((8,)), [True, True, True]),
        atol=1e-3,
    ),
    Case(
        "aten.native_layer_norm_backward.default",
        (A, A, [8], STATS, STATS, T((8,)), None, [True, True, False]),
    ),
    Case(
        "aten.native_layer_norm_backward.default",
        (X, X, [6], T((8, 1)), T((8, 1)), None, None, [True, False, False]),
    ),
    Case("aten._fused_rms_norm.default", (A, [8], T((8,)), 1e-5)),
    Case("aten._fused_rms_norm.default", (A, [8], None, None)),
    # nll_loss: reduction 0 none, 1 mean, 2 sum
    Case("aten.nll_loss_forward.default", (LOGITS, TARGET, None, 1, -100)),
    Case("aten.nll_loss_forward.default", (LOGITS, TARGET, T((5,)), 1, -100)),
    Case("aten.nll_loss_forward.default", (LOGITS, TARGET, T((5,)), 2, 3)),
    Case("aten.nll_loss_forward.default", (T((6, 5)), Ints((6,), 5), None, 0, 1)),
    Case("aten.nll_loss_forward.default", (T((6, 5)), Ints((6,), 5), None, 2, -100)),
    Case("aten.nll_loss_forward.default", (T((5,)), Ints((), 5), None, 1, -100)),
    Case("aten.nll_loss_backward.default", (T(()), LOGITS, TARGET, None, 1, -100, T(())), atol=1e-3),
    Case("aten.nll_loss_backward.default", (T((8,)), LOGITS, TARGET, T((5,)), 0, -100, T(()))),
    Case("aten.nll_loss_backward.default", (T(()), T((6, 5)), Ints((6,), 5), None, 2, 1, T(()))),
    # mse_loss: reduction 0 none, 1 mean, 2 sum
    Case("aten.mse_loss.default", (T((8, 6)), T((8, 6)), 0)),
    Case("aten.mse_loss.default", (T((8, 6)), T((8, 6)), 1)),
    Case("aten.mse_loss.default", (T((6, 8)), T((6, 8)), 2)),
    Case("aten.mse_loss_backward.default", (T(()), T((8, 6)), T((8, 6)), 2)),
    Case("aten.mse_loss_backward.default", (T((8, 6)), T((8, 6)), T((8, 6)), 0)),
]


@pytest.mark.parametrize("mesh_shape", MESHES, ids=lambda m: "x".join(map(str, m)))
@pytest.mark.parametrize("case", CASES, ids=str)
def test_every_strategy_runs_as_predicted(gloo, case: Case, mesh_shape: tuple[int, ...]) -> None:  # noqa: F811
    failures = gloo.check(case, mesh_shape)
    assert not failures, "\n".join(failures)


# --------------------------------------------------------------------------- the shared generators


def outputs(op: str, args: tuple, mesh_shape: tuple[int, ...] = (4,)) -> list[list[list[str]]]:
    """Every strategy's output placements as text, first output only."""
    s = op_strategies(resolve_op(op), args, {}, make_mesh(mesh_shape))
    return [spec_text(s.output_specs[i, 0]) for i in range(len(s))]


def test_reduced_dims_are_normalised_and_empty_means_all() -> None:
    assert reduced_dims(-1, 3) == [2]
    assert reduced_dims([2, -3], 3) == [0, 2]
    assert reduced_dims(None, 2) == [0, 1]
    assert reduced_dims([], 2) == [0, 1]


def test_an_explicit_empty_dim_list_keeps_shards_away_unless_it_is_the_default() -> None:
    # DTensor reads sum(x, []) as reducing nothing; amax's default dim is [], which DTensor never sees.
    assert outputs("aten.sum.dim_IntList", (T((8, 8)), [])) == [["R"], ["P"]]
    assert outputs("aten.mean.dim", (T((8, 8)), [])) == [["R"]]
    assert outputs("aten.amax.default", (T((8, 8)), [])) == [["R"], ["P(max)"], ["P(max)"]]


def test_a_kept_dim_shifts_left_past_reduced_dims_unless_keepdim() -> None:
    assert reduction_rules(3, [0], keepdim=False, reduced=P) == [[P, 0], [0, 1], [1, 2]]
    assert reduction_rules(3, [0], keepdim=True, reduced=P) == [[P, 0], [1, 1], [2, 2]]
    assert reduction_rules(2, [1], keepdim=False, reduced=None, outputs=2) == [[0, 0, 0]]
    assert reduction_rules(1, [0], keepdim=False, reduced=P, partial_passthrough=True) == [[P, 0], [P, P]]


def test_batch_dim_rules_skip_the_dims_the_op_acts_along() -> None:
    assert batch_dim_rules(3, [2], width=2) == [[0, 0], [1, 1]]


def test_each_reduction_emits_its_own_partial() -> None:
    # sum: P from the reduced dim, and P passing through from a partial input.
    assert outputs("aten.sum.dim_IntList", (X, [1])) == [["R"], ["S(0)"], ["P"], ["P"]]
    assert outputs("aten.amax.default", (T((8, 8)), [1])) == [["R"], ["S(0)"], ["P(max)"]]
    assert outputs("aten.mean.dim", (T((8, 8)), [1])) == [["R"], ["S(0)"], ["P(avg)"]]


def test_mean_and_max_reduce_only_even_shards() -> None:
    # dim 1 of X (6 over 4 ranks: 2, 2, 2, 0) is uneven: the mean of shard means would be biased, and
    # the max of the empty shard raises. Neither a partial from it nor the uneven S(1) is offered.
    assert outputs("aten.mean.dim", (X, [1])) == [["R"], ["S(0)"]]
    assert outputs("aten.amax.default", (X, [1])) == [["R"], ["S(0)"]]
    assert outputs("aten.sum.dim_IntList", (X, [1]))[2] == ["P"]  # a sum of nothing is 0: fine
    # A kept dim may split unevenly: the mean over dim 0 keeps X's uneven dim 1 sharded.
    assert outputs("aten.mean.dim", (X, [0])) == [["R"], ["P(avg)"], ["S(0)"]]


def test_nll_loss_mean_is_not_split_with_class_weights() -> None:
    # Per-shard weighted means do not average to the weighted mean; sums do add up.
    assert outputs("aten.nll_loss_forward.default", (LOGITS, TARGET.meta, T((5,)), 1, -100)) == [["R"]]
    assert outputs("aten.nll_loss_forward.default", (LOGITS, TARGET.meta, T((5,)), 2, -100)) == [["R"], ["P"]]
    assert outputs("aten.nll_loss_forward.default", (LOGITS, TARGET.meta, None, 1, -100)) == [
        ["R"],
        ["P(avg)"],
    ]
    # A batch of 6 over 4 ranks: a sum may split unevenly, a mean may not.
    uneven = (T((6, 5)), T((6,), torch.int64), None)
    assert outputs("aten.nll_loss_forward.default", (*uneven, 2, -100)) == [["R"], ["P"]]
    assert outputs("aten.nll_loss_forward.default", (*uneven, 1, -100)) == [["R"]]


def test_layer_norm_backward_gives_partial_parameter_gradients() -> None:
    args = (A, A, [8], STATS, STATS, T((8,)), T((8,)), [True, True, True])
    s = op_strategies(aten.native_layer_norm_backward.default, args, {}, make_mesh((4,)))
    rows = [[spec_text(o) for o in s.output_specs[i]] for i in range(len(s))]
    assert rows == [[["R"], ["R"], ["R"]], [["S(0)"], ["P"], ["P"]], [["S(1)"], ["P"], ["P"]]]
    assert s.input_specs[1].tolist()[-2:] == [[R], [R]]  # weight and bias stay whole


def test_rms_norm_backward_matches_layer_norm_backward_without_mean() -> None:
    # No CPU kernel for _fused_rms_norm_backward in this build, so no conformance case: the rows are
    # pinned here instead (DTensor's own rule: grad_input follows the leading dim, grad_weight is P).
    args = (A, A, [8], STATS, T((8,)), [True, True])
    s = op_strategies(aten._fused_rms_norm_backward.default, args, {}, make_mesh((4,)))
    assert [[spec_text(o) for o in s.output_specs[i]] for i in range(len(s))] == [
        [["R"], ["R"]],
        [["S(0)"], ["P"]],
        [["S(1)"], ["P"]],
    ]
    assert [[spec_text(x) for x in s.input_specs[i]] for i in range(len(s))][1] == [
        ["S(0)"],
        ["S(0)"],
        ["S(0)"],
        ["R"],
    ]


def test_counts_on_a_2d_mesh_are_the_product_of_single_axis_rows() -> None:
    # sum over dim 1 of (8, 8): R, S(0), P from the reduced dim, P passing through: 4 rows -> 4 x 4.
    assert len(op_strategies(aten.sum.dim_IntList, (T((8, 8)), [1]), {}, make_mesh((2, 2)))) == 16
