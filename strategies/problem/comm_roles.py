"""What each redistribution of a step is for, and so whether a schedule can hide it behind compute.

A problem edge moves one value from its producer to a reader. Its *role*:

- ``parameter``: the value is a parameter, or is made from one parameter alone (its cast to the compute dtype,
  its transpose or view): moving it is gathering the parameter, which FSDP does ahead of the compute that
  reads it (prefetch), so it can run behind the compute before;
- ``gradient``: the reader is a gradient's sink, or an op only gradients' reductions wait for (a weight
  gradient's transpose or cast after the matmul that makes it): the reduction runs behind the rest of the
  backward;
- ``activation``: anything else; its reader waits for it.

The two-stream simulator (:mod:`strategies.plan.schedule`) schedules by these roles and the program credits
the hidden share of the first two (:mod:`strategies.problem.builder`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# The problem's nodes and edges (`strategies.problem.builder.ProblemNode`, `Edge`), read by their `kind`,
# `producer` and `consumer`: typed loosely, as the builder imports this module.
ProblemNode = Edge = Any

PARAMETER, GRADIENT, ACTIVATION = "parameter", "gradient", "activation"


def op_order(nodes: Sequence[ProblemNode], intervals: Sequence[Sequence[int]]) -> list[int]:
    """The op nodes in the order the step runs them (by the position they start at)."""
    return sorted(
        (i for i, node in enumerate(nodes) if node.kind == "op"), key=lambda i: (int(intervals[i][0]), i)
    )


def weights_of(nodes: Sequence[ProblemNode], edges: Sequence[Edge], ops: Sequence[int]) -> dict[int, int]:
    """Op node -> the parameter it is made from, for the ops that read one parameter alone (directly or
    through other such ops)."""
    inputs: dict[int, set[int]] = {}
    for edge in edges:
        inputs.setdefault(edge.consumer, set()).add(edge.producer)
    made_from: dict[int, int] = {}
    for node in ops:
        roots = set()
        for producer in inputs.get(node, ()):
            if nodes[producer].kind == "parameter":
                roots.add(producer)
            elif producer in made_from:
                roots.add(made_from[producer])
            else:
                roots = set()
                break
        if len(roots) == 1:
            made_from[node] = roots.pop()
    return made_from


def gradient_tail(nodes: Sequence[ProblemNode], edges: Sequence[Edge], ops: Sequence[int]) -> set[int]:
    """The op nodes only gradients' reductions wait for: every reader of their outputs is a gradient sink or
    another such op."""
    readers: dict[int, set[int]] = {}
    for edge in edges:
        readers.setdefault(edge.producer, set()).add(edge.consumer)
    tail: set[int] = set()
    for node in reversed(ops):
        consumers = readers.get(node, set())
        if consumers and all(nodes[c].kind == "gradient" or c in tail for c in consumers):
            tail.add(node)
    return tail


@dataclass(frozen=True)
class StepRoles:
    """The step as the schedule reads it: its ops in order, the ops made from one parameter alone, the ops
    only gradients' reductions wait for, and each edge's role."""

    ops: list[int]
    made_from: dict[int, int]
    tail: set[int]
    roles: list[str]


def step_roles(
    nodes: Sequence[ProblemNode], edges: Sequence[Edge], intervals: Sequence[Sequence[int]]
) -> StepRoles:
    """Each edge's role (module docstring), and what it was read from."""
    ops = op_order(nodes, intervals)
    made_from, tail = weights_of(nodes, edges, ops), gradient_tail(nodes, edges, ops)
    roles = []
    for edge in edges:
        if nodes[edge.producer].kind == "parameter" or edge.producer in made_from:
            roles.append(PARAMETER)
        elif nodes[edge.consumer].kind == "gradient" or edge.consumer in tail:
            roles.append(GRADIENT)
        else:
            roles.append(ACTIVATION)
    return StepRoles(ops, made_from, tail, roles)
