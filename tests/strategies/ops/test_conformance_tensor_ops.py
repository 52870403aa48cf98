"""Factories, indexing and embedding: every strategy runs in DTensor on 4 gloo ranks as predicted.

Factories without a tensor argument and ``operator.getitem`` never reach DTensor (no DTensor argument,
or plain Python on a tuple); their strategies are checked directly.
"""

from __future__ import annotations

import operator

import numpy as np
import pytest
import torch

from strategies.cost.mesh import make_mesh
from strategies.ops.generate import op_strategies
from strategies.placement import NONE, P_MASK, P, R
from strategies.tensor_meta import TensorMeta as T
from tests.strategies.ops.conformance import MESHES, Case, Ints, gloo  # noqa: F401

aten = torch.ops.aten

CASES = [
    Case("aten.zeros_like.default", (T((6, 4)),)),
    Case("aten.ones_like.default", (T((2, 4, 6)),)),
    Case("aten.full_like.default", (T((6, 5)), 2.5)),
    Case("aten.empty_like.default", (T((6, 4)),), check_values=False),
    Case("aten.new_zeros.default", (T((6, 4)), [6, 4])),
    Case("aten.new_ones.default", (T((6, 4)), [3, 5])),
    Case("aten.new_full.default", (T((8, 4)), [8, 4], 1.5)),
    Case("aten.new_empty.default", (T((8, 6)), [8, 6]), check_values=False),
    Case("aten.index_select.default", (T((8, 6)), 0, Ints((5,), 8))),
    Case("aten.index_select.default", (T((4, 6, 5)), -1, Ints((6,), 5))),
    Case("aten.gather.default", (T((8, 6)), 1, Ints((8, 3), 6))),
    Case("aten.gather.default", (T((8, 6)), 0, Ints((5, 6), 8))),
    Case("aten.scatter.value", (T((8, 6)), 1, Ints((8, 3), 6), 2.0)),
    Case("aten.scatter.src", (T((8, 6)), 0, Ints((1, 6), 8), T((1, 6)))),
    Case("aten.index.Tensor", (T((8, 6, 4)), [None, Ints((5,), 6)])),
    Case("aten.index.Tensor", (T((8, 6, 4)), [Ints((4, 5), 8), None, Ints((1, 5), 4)])),
    Case("aten.embedding.default", (T((16, 8)), Ints((4, 6), 16))),
    Case("aten.embedding.default", (T((10, 6)), Ints((6,), 10))),  # uneven: 10 rows, 6 columns over 4
    Case("aten.embedding_dense_backward.default", (T((4, 6, 8)), Ints((4, 6), 16), 16, -1, False)),
    Case("aten.embedding_dense_backward.default", (T((6, 8)), Ints((6,), 10), 10, 3, True)),
]


@pytest.mark.parametrize("mesh_shape", MESHES, ids=lambda m: "x".join(map(str, m)))
@pytest.mark.parametrize("case", CASES, ids=str)
def test_every_strategy_runs_as_predicted(gloo, case: Case, mesh_shape: tuple[int, ...]) -> None:  # noqa: F811
    failures = gloo.check(case, mesh_shape)
    assert not failures, "\n".join(failures)


# ------------------------------------------------------------------------------------- without ranks


def _specs(op, args: tuple, mesh: str = "2x2", kwargs: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
    strategies = op_strategies(op, args, kwargs or {}, make_mesh(mesh))
    return strategies.output_specs, strategies.input_specs


@pytest.mark.parametrize(
    ("op", "args"),
    [
        (aten.zeros.default, ([64, 32],)),
        (aten.ones.default, ([8],)),
        (aten.full.default, ([4, 4], 3.0)),
        (aten.empty.memory_format, ([4, 4],)),
        (aten.arange.default, (12,)),
        (aten.arange.start, (2, 12)),
        (aten.arange.start_step, (0, 12, 3)),
        (aten.scalar_tensor.default, (1.5,)),
    ],
    ids=str,
)
def test_factories_without_tensor_arguments_are_replicated(op, args: tuple) -> None:
    outputs, inputs = _specs(op, args, "8x8")
    assert outputs.tolist() == [[[R, R]]]
    assert inputs.shape == (1, 0, 2)


def test_new_factory_of_another_shape_reads_nothing() -> None:
    outputs, inputs = _specs(aten.new_zeros.default, (T((6, 4)), [3, 5]))
    assert {tuple(o[0]) for o in outputs} == {(R, R)}
    assert (NONE, NONE) in {tuple(i[0]) for i in inputs}


def test_getitem_output_is_the_selected_member_and_the_rest_is_not_read() -> None:
    members = (T((8, 4, 6)), T((8, 4)), T((8,)))
    outputs, inputs = _specs(operator.getitem, (members, 1))
    assert len(outputs) > 1
    assert (outputs[:, 0] == inputs[:, 1]).all()
    assert (inputs[:, [0, 2]] == NONE).all()
    chosen = {tuple(o[0]) for o in outputs}
    assert {(0, 1), (R, R), (P, 0), (R, 0)} <= chosen


def test_getitem_with_a_negative_index_and_a_non_tensor_member() -> None:
    outputs, inputs = _specs(operator.getitem, ((T((8, 4)), None, T((6,))), -1))
    assert (outputs[:, 0] == inputs[:, 1]).all() and (inputs[:, 0] == NONE).all()
    outputs, inputs = _specs(operator.getitem, ((T((8, 4)), None, T((6,))), 1))
    assert outputs.tolist() == [[[NONE, NONE]]] and (inputs == NONE).all()


def test_getitem_on_a_tensor_is_replicated() -> None:
    outputs, inputs = _specs(operator.getitem, (T((8, 4)), 1))
    assert outputs.tolist() == [[[R, R]]] and inputs.tolist() == [[[R, R]]]


def test_no_tensor_is_partial_under_two_reductions() -> None:
    for op, args in [
        (aten.view.default, (T((8, 6, 4)), [8, 24])),
        (operator.getitem, ((T((8, 4)), T((8,))), 0)),
        (aten.zeros_like.default, (T((8, 4)),)),
    ]:
        outputs, inputs = _specs(op, args)
        for specs in (outputs, inputs):
            kinds = sum((specs == p).any(axis=2).astype(int) for p in (P, -3, -4, -5))
            assert (kinds <= 1).all(), op


def test_embedding_strategies_on_8x8() -> None:
    outputs, inputs = _specs(aten.embedding.default, (T((50304, 768)), T((8, 1024), torch.int64)), "8x8")
    triples = {(tuple(o[0]), tuple(i[0]), tuple(i[1])) for o, i in zip(outputs, inputs, strict=True)}
    assert ((0, 2), (R, 1), (0, R)) in triples  # batch over dp, embedding columns over tp
    assert ((1, P_MASK), (R, 0), (1, R)) in triples  # sequence over dp, vocabulary rows over tp
    assert ((P_MASK, 1), (0, R), (R, 1)) not in triples  # indices cut after the masked axis: cannot reduce
    assert ((P_MASK, P_MASK), (0, 0), (R, R)) not in triples  # vocabulary over two axes: DTensor refuses
    assert not (outputs == P).any()  # a masked partial is never a plain partial


def test_embedding_backward_with_frequency_scaling_does_not_split_the_batch() -> None:
    outputs, inputs = _specs(
        aten.embedding_dense_backward.default, (T((6, 8)), T((6,), torch.int64), 10, -1, True), "4"
    )
    rows = {(tuple(o[0]), tuple(i[0]), tuple(i[1])) for o, i in zip(outputs, inputs, strict=True)}
    assert rows == {((R,), (R,), (R,)), ((1,), (1,), (R,)), ((P,), (P,), (R,))}
