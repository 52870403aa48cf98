"""Deep stacks planned from a short capture: a few layers stand for all of them.

A model of ``total`` identical transformer layers is captured with ``captured`` of them (first, a few
middle copies, last). The middle copies are tied (:mod:`strategies.problem.layer_sharing`), so in the full
model every middle layer takes the same strategies, and the full step's cost and memory follow from the short
capture exactly:

- **costs**: each of the ``c = captured - 2`` middle copies stands for ``(total - 2) / c`` layers, so its
  nodes and the edges inside it (or from tensors outside every layer, like the rotary tables) are weighted
  by that; an edge from one middle copy to the next stands for the ``total - 3`` boundaries between middle
  layers of the full stack, weighted ``(total - 3) / (c - 1)``; edges between a middle copy and the first or
  last layer occur once in both.
- **memory**: the ``total - 2 - c`` layers the capture leaves out sit, in the full step, between the first
  middle copy and the next. Each tensor of the first middle copy gets a *ghost* (same strategy, a solver
  group with it, no cost) using ``total - 2 - c`` times its bytes over the time the left-out copies hold
  theirs: parameters (with their optimizer state) the whole step; gradients from the first middle copy's
  backward to the end; activations saved for backward (alive from its forward to its backward) from the end
  of its forward to the start of its backward. Temporaries need no ghost: only one layer runs at a time.
  At every step of the short timeline the live bytes then equal the full step's at the corresponding step
  of its last (forward) or first (backward) middle layer, where the full stack's peak over middle layers
  lies. A value that may be recomputed (:mod:`strategies.problem.recompute`) holds its bytes between its
  forward and its backward in a ``kept`` node of its own (none when recomputed): that node gets the ghost.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from strategies.problem.layer_sharing import LAYER

MIN_CAPTURED = 4
"""First, two tied middle copies (so the edge from one middle layer to the next is seen), last."""


@dataclass(frozen=True)
class LayerRepeat:
    """``captured`` layers of the graph stand for a stack of ``total``."""

    captured: int
    total: int

    def __post_init__(self) -> None:
        if self.captured < MIN_CAPTURED or self.total < self.captured:
            raise ValueError(
                f"layer repeat: need at least {MIN_CAPTURED} captured layers and no more than the total "
                f"(got {self.captured} of {self.total})"
            )

    @property
    def middle_weight(self) -> float:
        """Layers of the full stack each middle copy stands for."""
        return (self.total - 2) / (self.captured - 2)

    @property
    def boundary_weight(self) -> float:
        """Middle-to-middle layer boundaries of the full stack each captured boundary stands for."""
        return (self.total - 3) / (self.captured - 3)

    @property
    def left_out(self) -> int:
        """Middle layers of the full stack the capture does not hold."""
        return self.total - self.captured

    def full_layer(self, captured_layer: int) -> list[int]:
        """The layers of the full stack a captured layer stands for (the last captured one is the last)."""
        if captured_layer == 0:
            return [0]
        if captured_layer == self.captured - 1:
            return [self.total - 1]
        if captured_layer == 1:
            return list(range(1, 2 + self.left_out))
        return [captured_layer + self.left_out]

    def expand_names(self, placements: dict[str, object]) -> dict[str, object]:
        """Per-parameter values renamed to the full stack (``layers.1`` stands for ``layers.1`` … ``k``)."""
        expanded: dict[str, object] = {}
        for name, value in placements.items():
            for full in self._full_names(name):
                expanded[full] = value
        return expanded

    def full_name(self, captured_name: str) -> str:
        """The full-stack name of a captured parameter (its first layer when it stands for several)."""
        return self._full_names(captured_name)[0]

    def captured_name(self, full_name: str) -> str:
        """The captured parameter that stands for a full-stack parameter."""
        match = LAYER.search(full_name)
        if match is None:
            return full_name
        layer = int(match.group(1))
        for captured in range(self.captured):
            if layer in self.full_layer(captured):
                return f"{full_name[: match.start(1)]}{captured}{full_name[match.end(1) :]}"
        return full_name

    def _full_names(self, name: str) -> list[str]:
        match = LAYER.search(name)
        if match is None:
            return [name]
        return [
            f"{name[: match.start(1)]}{layer}{name[match.end(1) :]}"
            for layer in self.full_layer(int(match.group(1)))
        ]


def cost_weights(
    repeat: LayerRepeat,
    node_layer: Sequence[int | None],
    edges: Sequence[tuple[int, int]],
    middle: Sequence[int],
) -> tuple[np.ndarray, np.ndarray]:
    """(node weights, edge weights) of the module docstring; ``node_layer`` is each problem node's captured
    layer (None outside every layer), ``middle`` the tied middle layers."""
    middle_set = set(middle)
    in_middle = np.array([layer in middle_set for layer in node_layer], dtype=bool)
    node_weight = np.where(in_middle, repeat.middle_weight, 1.0)
    edge_weight = np.ones(len(edges))
    for e, (a, b) in enumerate(edges):
        la, lb = node_layer[a], node_layer[b]
        if not (in_middle[a] or in_middle[b]):
            continue
        if in_middle[a] and in_middle[b]:
            edge_weight[e] = repeat.middle_weight if la == lb else repeat.boundary_weight
        elif la is None or lb is None:
            edge_weight[e] = repeat.middle_weight
    return node_weight, edge_weight


def ghost_intervals(
    intervals: Sequence[tuple[int, int]],
    kinds: Sequence[str],
    members: Sequence[int],
    forward_end: int,
    backward_start: int,
    step_end: int,
) -> list[tuple[int, tuple[int, int]]]:
    """(node, interval) of each ghost for the nodes ``members`` of the first middle copy, whose forward ops
    end before ``forward_end`` and backward ops start at ``backward_start`` (positions on the timeline)."""
    ghosts: list[tuple[int, tuple[int, int]]] = []
    for i in members:
        start, end = intervals[i]
        if kinds[i] == "parameter":
            ghosts.append((i, (0, step_end)))
        elif kinds[i] == "gradient":
            ghosts.append((i, (min(start, backward_start), step_end)))
        elif kinds[i] == "kept" or (start < forward_end and end > backward_start):  # held over the gap
            ghosts.append((i, (forward_end, backward_start)))
    return ghosts


__all__ = ["MIN_CAPTURED", "LayerRepeat", "cost_weights", "ghost_intervals"]
