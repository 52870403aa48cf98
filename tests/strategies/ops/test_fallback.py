"""Ops without autoshard rules: PyTorch's own rules when it has them, else replicate-only with a warning."""

from __future__ import annotations

import logging

import pytest
import torch

from strategies.cost.mesh import make_mesh
from strategies.ops.fallback import pytorch_rows
from strategies.ops.generate import clear_cache, op_strategies
from strategies.ops.registry import OpInfo, lookup
from strategies.placement import NONE, P_AVG, P_MAX, P_MIN, P, R
from strategies.tensor_meta import TensorMeta as T
from strategies.tensor_meta import flatten_tensors, meta_outputs
from tests.strategies.ops.conformance import Case, gloo, resolve_op  # noqa: F401

aten = torch.ops.aten


@torch.library.custom_op("autoshard_fallback_test::scramble", mutates_args=())
def _scramble(x: torch.Tensor) -> torch.Tensor:
    return x.flip(0).cumsum(0)


@_scramble.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


SCRAMBLE = torch.ops.autoshard_fallback_test.scramble.default


def info(op, *args) -> OpInfo:
    """What a rule function sees for ``op(*args)``."""
    return OpInfo(op, args, {}, tuple(flatten_tensors(args)), meta_outputs(op, args, {}))


def unregistered(op):
    """``op``, after checking autoshard has no rules for it (so generation must use the fallback)."""
    assert lookup(op) is None, f"{op} now has autoshard rules: pick another op for this fallback test"
    return op


def test_an_op_with_single_axis_rules_gets_pytorchs_rows() -> None:
    rows = pytorch_rows(info(aten.flip.default, T((8, 12)), [0]))
    # flip along dim 0: shard the other dim, or pass any partial through; dim 0 stays whole.
    assert rows == [[1, 1], [P, P], [P_AVG, P_AVG], [P_MAX, P_MAX], [P_MIN, P_MIN]]


def test_an_op_with_only_a_full_strategy_is_asked_on_a_probe_mesh() -> None:
    rows = pytorch_rows(info(aten.topk.default, T((8, 12)), 3, 1))
    # topk along dim 1 keeps dim 0 sharded on values, indices and the input; nothing else is allowed.
    assert sorted(map(list, rows)) == [[R, R, R], [0, 0, 0]]


def test_a_list_argument_is_one_tensor_per_element() -> None:
    rows = pytorch_rows(info(aten.stack.default, [T((8, 12)), T((8, 12))]))
    # stack inserts dim 0: inputs sharded on dim d give an output sharded on d + 1; partials pass through.
    assert sorted(map(list, rows)) == [[P, P, P], [R, R, R], [1, 0, 0], [2, 1, 1]]


def test_non_tensor_outputs_and_masked_outputs_are_not_placed() -> None:
    op = aten.native_layer_norm_backward.default
    args = (T((8, 12)), T((8, 12)), [12], T((8, 1)), T((8, 1)), T((12,)), T((12,)), [True, False, True])
    rows = pytorch_rows(info(op, *args))
    assert rows and all(row[1] == NONE for row in rows)
    assert [0, NONE, P, 0, 0, 0, 0, R, R] in rows  # batch-sharded: weight and bias gradients are partial


def test_op_strategies_reports_pytorch_as_the_source() -> None:
    s = op_strategies(unregistered(aten.flip.default), (T((8, 12)), [0]), {}, make_mesh("2x2"))
    assert s.source == "pytorch"
    assert len(s) == 6**2 - 4 * 3  # all-R plus five rows on each axis, less 12 mixing two reductions
    assert (s.output_specs[:, 0] == s.input_specs[:, 0]).all()  # flip keeps the placement it is given
    assert not (s.output_specs == 0).any()  # and never cuts the dim it reverses


def test_an_op_nobody_knows_is_replicate_only_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    clear_cache()
    assert pytorch_rows(info(SCRAMBLE, T((8, 12)))) is None
    with caplog.at_level(logging.WARNING, logger="autoshard.strategies"):
        s = op_strategies(SCRAMBLE, (T((8, 12)),), {}, make_mesh("2x2"))
    assert s.source == "replicate"
    assert len(s) == 1
    assert s.describe(0)["output"] == [["R", "R"]] and s.describe(0)["inputs"] == [["R", "R"]]
    assert any("no sharding strategy" in r.message and "scramble" in r.message for r in caplog.records)
    assert s.compute_s[0] > 0


def test_a_failing_pytorch_strategy_gives_none_not_an_exception() -> None:
    # PyTorch's function raises on an argument that is not what the schema says.
    assert pytorch_rows(info(aten.flip.default, T((8, 12)), [0]))  # sanity: it works
    broken = OpInfo(aten.flip.default, ("not a tensor", [0]), {}, (T((8, 12)),), (T((8, 12)),))
    assert pytorch_rows(broken) is None
    not_an_overload = OpInfo(len, (T((4,)),), {}, (T((4,)),), (None,))
    assert pytorch_rows(not_an_overload) is None


FALLBACK_CASES = [
    (Case("aten.kthvalue.default", (T((8, 12)), 3, 1)), (4,)),  # single-axis rules, two outputs
    (Case("aten.kthvalue.default", (T((8, 12)), 3, 1)), (2, 2)),
    (Case("aten.topk.default", (T((8, 12)), 3, 1)), (4,)),  # a full strategy function
    (Case("aten.topk.default", (T((8, 12)), 3, 1)), (2, 2)),
    (Case("aten.sort.default", (T((6, 12)), 1)), (2, 2)),  # uneven: 6 rows over 4
    # flip passes every partial through: a 2-D mesh must not mix reductions in one spec.
    (Case("aten.flip.default", (T((8, 12)), [0])), (4,)),
    (Case("aten.flip.default", (T((8, 12)), [0])), (2, 2)),
]


@pytest.mark.parametrize(("case", "mesh_shape"), FALLBACK_CASES, ids=lambda v: str(v).replace(" ", ""))
def test_fallback_strategies_run_as_predicted(gloo, case: Case, mesh_shape: tuple[int, ...]) -> None:  # noqa: F811
    unregistered(resolve_op(case.op))
    failures = gloo.check(case, mesh_shape)
    assert not failures, "\n".join(failures)
