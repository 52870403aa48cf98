"""Placement codes and text, and the shared expansion/filter/cost steps of strategy generation."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import Partial, Replicate, Shard

from strategies.cost.mesh import make_mesh
from strategies.ops.generate import op_strategies
from strategies.ops.registry import register
from strategies.placement import (
    NONE,
    P_AVG,
    P_MAX,
    P,
    R,
    code_text,
    from_dtensor,
    parse_spec,
    spec_text,
    to_dtensor,
)
from strategies.tensor_meta import TensorMeta as T

aten = torch.ops.aten


@torch.library.custom_op("autoshard_test::twice", mutates_args=())
def _twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@_twice.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


TWICE = torch.ops.autoshard_test.twice.default


@pytest.fixture
def twice_unregistered():
    """A test-only op; its rules are removed (and the cache cleared) afterwards."""
    from strategies.ops.generate import clear_cache
    from strategies.ops.registry import _REGISTRY

    yield TWICE
    _REGISTRY.pop(TWICE, None)
    clear_cache()


def test_placement_text_round_trips() -> None:
    spec = (0, R, P, P_AVG, P_MAX, 3)
    assert spec_text(spec) == ["S(0)", "R", "P", "P(avg)", "P(max)", "S(3)"]
    assert parse_spec(spec_text(spec)) == spec
    assert parse_spec(["Shard(2)", "Replicate()", "Partial()"]) == (2, R, P)
    assert code_text(NONE) == "*"


@pytest.mark.parametrize("bad", ["S(-1)", "Q", "S(x)", ""])
def test_bad_placement_text_is_refused_with_the_text(bad: str) -> None:
    with pytest.raises(ValueError, match="not a placement"):
        parse_spec([bad])


def test_dtensor_placements_round_trip() -> None:
    spec = (1, R, P, P_MAX)
    placements = to_dtensor(spec)
    assert placements == (Shard(1), Replicate(), Partial("sum"), Partial("max"))
    assert from_dtensor(placements) == spec


def test_all_replicate_comes_first_and_rows_keep_their_order() -> None:
    s = op_strategies(aten.mm.default, (T((64, 32)), T((32, 16))), {}, make_mesh("4"))
    assert [s.describe(i)["output"][0] for i in range(len(s))] == [["R"], ["P"], ["S(0)"], ["S(1)"]]
    assert [s.describe(i)["inputs"] for i in range(len(s))][1] == [["S(1)"], ["S(0)"]]


def test_a_dim_is_only_sharded_over_axes_that_fit_it() -> None:
    # n = 16 cannot be cut 64 ways, so (S(1), S(1)) on mat2 is filtered on 8x8; 2 strategies go.
    s = op_strategies(aten.mm.default, (T((64, 32)), T((32, 16))), {}, make_mesh("8x8"))
    assert len(s) == 14
    assert all(row[1] != [1, 1] for row in s.input_specs.tolist())
    # A dim of size 1 is never sharded.
    s = op_strategies(aten.mm.default, (T((1, 32)), T((32, 16))), {}, make_mesh("4"))
    assert [s.describe(i)["output"][0] for i in range(len(s))] == [["R"], ["P"], ["S(1)"]]


def test_uneven_shards_are_kept_and_cost_their_largest_piece() -> None:
    s = op_strategies(aten.mm.default, (T((10, 8)), T((8, 8))), {}, make_mesh("4"))
    row_sharded = [i for i in range(len(s)) if s.describe(i)["output"][0] == ["S(0)"]]
    assert len(row_sharded) == 1
    assert s.memory_bytes[row_sharded[0]] == 3 * 8 * 4  # ceil(10 / 4) rows of 8 floats


def test_even_only_rules_drop_uneven_shards(twice_unregistered) -> None:
    register(twice_unregistered, even_only=True)(lambda info: [[0, 0]])
    assert len(op_strategies(twice_unregistered, (T((10, 4)),), {}, make_mesh("4"))) == 1
    assert len(op_strategies(twice_unregistered, (T((12, 4)),), {}, make_mesh("4"))) == 2


def test_a_rule_of_the_wrong_length_is_a_clear_error(twice_unregistered) -> None:
    register(twice_unregistered)(lambda info: [[0, 0, 0]])
    with pytest.raises(ValueError, match="expected 1 outputs"):
        op_strategies(twice_unregistered, (T((12, 5)),), {}, make_mesh("2"))


def test_views_cost_nothing_and_kernels_cost_at_least_a_launch() -> None:
    mesh = make_mesh("2x2", hardware="h100")
    t = op_strategies(aten.t.default, (T((64, 32)),), {}, mesh)
    assert (t.compute_s == 0).all()
    mm = op_strategies(aten.mm.default, (T((64, 32)), T((32, 16))), {}, mesh)
    assert (mm.compute_s >= mesh.hardware.launch_s).all()
