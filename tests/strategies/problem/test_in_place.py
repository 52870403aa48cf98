"""An in-place op writes into its argument and, through the views it was made by, into their base: those
edges keep their placement (T5's ``_shift_right``: ``new_zeros``, then ``slice(...).copy_`` and
``select(...).fill_``)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from strategies.cost.mesh import make_mesh
from strategies.graph.passes import capture_for_planning
from strategies.problem.builder import build_problem
from strategies.problem.in_place import placement_kept


class ShiftRight(nn.Module):
    """The decoder input of an encoder-decoder: the labels shifted right behind a start value."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, labels: torch.Tensor) -> torch.Tensor:
        shifted = labels.new_zeros(labels.shape)
        shifted[:, 1:] = labels[:, :-1].clone()
        shifted[:, 0] = 1.0
        return self.proj(shifted).sum()


def test_writes_and_the_views_they_go_through_keep_their_placement() -> None:
    torch.manual_seed(0)
    graph = capture_for_planning(ShiftRight(), (torch.randn(8, 8),), lambda loss: loss)
    kept = {(node.name, k) for node, k in placement_kept(graph.order)}
    by_op = {str(node.target): node.name for node in graph.order}
    copy, fill = by_op["aten.copy_.default"], by_op["aten.fill_.Tensor"]
    writes = {(copy, 0), (fill, 0)}
    written = [node.args[0] for node in graph.order if node.name in (copy, fill)]
    assert sorted(str(view.target) for view in written) == ["aten.select.int", "aten.slice.Tensor"]
    views = {(view.name, 0) for view in written}  # each is a view of new_zeros: its edge from it is kept
    assert writes | views <= kept, kept
    assert not any(name == copy and k == 1 for name, k in kept)  # the source is read, not written

    built = build_problem(graph, make_mesh("4"))
    for e, edge in enumerate(built.edges):
        consumer = built.nodes[edge.consumer].name
        assert edge.keeps_placement == ((consumer, edge.argument) in kept)
        if not edge.keeps_placement:
            continue
        src = built.nodes[edge.producer].output_specs[:, edge.output, :]
        dst = built.nodes[edge.consumer].input_specs[:, edge.argument, :]
        same = (src[:, None, :] == dst[None, :, :]).all(axis=2)
        matrix = built.problem.edge_matrix(e)
        assert np.isinf(matrix[~same]).all() and np.isfinite(matrix[same]).all(), consumer
    assert {built.nodes[edge.consumer].name for edge in built.edges if edge.keeps_placement} >= {copy, fill}
