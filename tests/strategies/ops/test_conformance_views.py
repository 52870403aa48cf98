"""View and shape ops: every strategy runs in DTensor on 4 gloo ranks as predicted (meshes (4,) and (2, 2)).

Plus plain checks of the dim maps and of meshes DTensor cannot split evenly (12 heads on 8x8).
"""

from __future__ import annotations

import sys

import pytest
import torch

from strategies.cost.mesh import make_mesh
from strategies.ops.generate import op_strategies
from strategies.ops.view_ops import expand_targets, permute_targets, reshape_targets
from strategies.placement import P, R
from strategies.tensor_meta import TensorMeta as T
from tests.strategies.ops.conformance import MESHES, Case, gloo  # noqa: F401

aten = torch.ops.aten

CASES = [
    # attention reshapes: [B, S, D] -> [B, S, H, Dh] -> [B, H, S, Dh] and back
    Case("aten.view.default", (T((2, 8, 16)), [2, 8, 4, 4])),
    Case("aten.transpose.int", (T((2, 8, 4, 4)), 1, 2)),
    Case("aten._unsafe_view.default", (T((2, 8, 4, 4)), [2, 8, 16])),
    Case("aten.view.default", (T((4, 6, 8)), [24, 8])),
    Case("aten.view.default", (T((4, 6, 8)), [-1, 48])),
    Case("aten.view.default", (T((8, 6)), [2, 4, 6])),
    Case("aten.view.default", (T((6, 4)), [4, 6])),  # one group, split of a flatten
    Case("aten.view.default", (T((4, 1, 8)), [4, 8, 1])),
    Case("aten.reshape.default", (T((8, 6, 4)), [8, 24])),
    Case("aten.flatten.using_ints", (T((4, 6, 8)), 1, 2)),
    Case("aten.permute.default", (T((2, 4, 6, 8)), [0, -2, 1, -1])),
    Case("aten.transpose.int", (T((6, 5, 4)), -1, 0)),  # uneven 6 and 5 over 4
    Case("aten.expand.default", (T((4, 1, 8)), [3, 4, 6, 8])),
    Case("aten.squeeze.default", (T((6, 1, 4)),)),
    Case("aten.squeeze.dim", (T((4, 1, 6)), -2)),
    Case("aten.squeeze.dims", (T((4, 1, 6, 1)), [1, 3])),
    Case("aten.unsqueeze.default", (T((6, 5)), -1)),
    Case("aten.split.Tensor", (T((6, 8)), 4, 1)),
    Case("aten.split_with_sizes.default", (T((8, 6)), [2, 5, 1], -2)),
    Case("aten.unbind.int", (T((3, 8, 6)), 0)),
    Case("aten.slice.Tensor", (T((8, 6)), 1, 1, 5)),
    Case("aten.slice.Tensor", (T((8, 6)), 0, 0, sys.maxsize)),  # the whole dim: may stay sharded
    Case("aten.select.int", (T((4, 6, 8)), -2, 3)),
    Case("aten.cat.default", ([T((4, 6)), T((4, 2))], 1)),
    Case("aten.cat.default", ([T((4, 6)), T((2, 6)), T((6, 6))], -2)),
    Case("aten.stack.default", ([T((4, 6)), T((4, 6))], 1)),
]


@pytest.mark.parametrize("mesh_shape", MESHES, ids=lambda m: "x".join(map(str, m)))
@pytest.mark.parametrize("case", CASES, ids=str)
def test_every_strategy_runs_as_predicted(gloo, case: Case, mesh_shape: tuple[int, ...]) -> None:  # noqa: F811
    failures = gloo.check(case, mesh_shape)
    assert not failures, "\n".join(failures)


# ------------------------------------------------------------------------------------- without ranks


def _strategies(op, args: tuple, mesh: str = "8x8"):
    return op_strategies(op, args, {}, make_mesh(mesh))


def test_reshape_maps_the_outermost_dim_of_each_group() -> None:
    assert reshape_targets((2, 8, 768), (2, 8, 12, 64)) == (0, 1, 2)
    assert reshape_targets((4, 6, 8), (24, 8)) == (0, None, 1)
    assert reshape_targets((1, 4, 1, 6), (4, 6, 1)) == (None, 0, None, 1)
    assert reshape_targets((2, 3), (3, 2)) == (0, None)
    assert reshape_targets((0, 4), (4, 0)) == (None, None)


def test_permute_and_expand_maps() -> None:
    assert permute_targets([2, 0, 1]) == (1, 2, 0)
    assert permute_targets([0, -1, 1]) == (0, 2, 1)
    assert expand_targets((4, 1, 8), (3, 4, 6, 8)) == (1, None, 3)


def test_twelve_heads_on_an_8x8_mesh_filter_instead_of_raising() -> None:
    split = _strategies(aten.view.default, (T((8, 1024, 768)), [8, 1024, 12, 64]))
    merge = _strategies(aten._unsafe_view.default, (T((8, 1024, 12, 64)), [8, 1024, 768]))
    assert len(split) > 1 and len(merge) > 1
    assert not (split.output_specs[:, 0] == 2).any(), "12 heads cannot be cut into 8 equal parts"
    assert not (merge.input_specs[:, 0] == 2).any()
    assert not (split.input_specs[:, 0] == 2).any(), "768 features only split along with the heads"


def test_twelve_heads_on_an_8x8_mesh_keep_the_shardable_ways() -> None:
    split = _strategies(aten.view.default, (T((64, 1024, 768)), [64, 1024, 12, 64]))
    specs = {(tuple(o[0]), tuple(i[0])) for o, i in zip(split.output_specs, split.input_specs, strict=True)}
    assert ((0, 0), (0, 0)) in specs  # batch 64 over both axes
    assert ((0, 1), (0, 1)) in specs  # batch over dp, sequence over tp
    assert ((P, 0), (P, 0)) in specs  # partial passes through
    assert not any(2 in out for out, _ in specs)  # heads never over 8


def test_transpose_of_heads_on_8x8_swaps_the_sharded_dims() -> None:
    strategies = _strategies(aten.transpose.int, (T((8, 1024, 12, 64)), 1, 2))
    pairs = {
        (tuple(o[0]), tuple(i[0]))
        for o, i in zip(strategies.output_specs, strategies.input_specs, strict=True)
    }
    assert ((0, 2), (0, 1)) in pairs
    assert ((R, 1), (R, 2)) in pairs  # 12 heads over 8: uneven, still a valid transpose


def test_views_cost_nothing_and_copies_do() -> None:
    view = _strategies(aten.view.default, (T((8, 6, 4)), [8, 24]), "2x2")
    cat = _strategies(aten.cat.default, ([T((8, 6)), T((8, 2))], 1), "2x2")
    assert (view.compute_s == 0).all()
    assert (cat.compute_s > 0).all()
