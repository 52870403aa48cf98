"""The order a planned step runs its ops in, with the plan's recomputation, and when each value goes.

A plan's ``recompute`` names forward values the backward makes again (:mod:`strategies.problem.recompute`):
each is dropped after its last forward reader and made again, with its *closure* (the ops of its layer between
it and what is still there: attention scores, views, casts, a dropout mask), when its layer's backward begins
-- the first backward op of the layer, where the program counted it. The ops made again run in forward order,
with the plan's placements, so the recomputation moves what the plan says it moves; what they read that the
forward would have dropped (a layer's input: *stored*) lives on until they have read it.

:func:`schedule` lists the ops as they run (forward, each layer's recomputation before its backward, the
backward) and, per entry, the values whose last reader it is: one rule for every value, recomputed or not,
so the step's memory is exactly what this order needs.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torch import fx

from strategies.graph.capture import JointGraph
from strategies.problem.recompute import AUTO, NONE, POLICIES, RECOMPUTE


class RecomputeMismatch(ValueError):
    """A plan recomputes a value this graph cannot make again (a message naming it)."""


@dataclass(frozen=True)
class Entry:
    """One op run of the step."""

    node: fx.Node
    again: bool = False
    """Made again in the backward (a recomputation); its first run was in the forward."""


def schedule(graph: JointGraph, plan: Mapping[str, Any]) -> tuple[list[Entry], list[list[fx.Node]]]:
    """(the op runs in order, per run the values to drop after it). Without recomputation: ``graph.order``.
    Raises :class:`RecomputeMismatch` when the plan recomputes a value the graph cannot make again."""
    again = _made_again(graph, plan)
    entries = []
    for index, node in enumerate(graph.order):
        entries += [Entry(op, again=True) for op in again.get(index, ())]
        entries.append(Entry(node))
    kept = {graph.loss, *graph.input_gradients.values()}
    return entries, _drops(entries, kept)


def _made_again(graph: JointGraph, plan: Mapping[str, Any]) -> dict[int, list[fx.Node]]:
    """Per index in ``graph.order``, the ops made again just before it, in forward order (with the
    ``getitem`` nodes that read their outputs)."""
    names = list(plan.get("recompute") or ())
    if not names:
        return {}
    from strategies.problem.builder import step_candidates

    policy = plan.get("request", {}).get("recompute", AUTO)
    candidates = step_candidates(graph, policy if policy in POLICIES and policy != NONE else AUTO)
    by_name = {node.name: node for node in graph.order}
    moments: dict[int, set[fx.Node]] = {}
    for name in names:
        node = by_name.get(name)
        candidate = candidates.get(node) if node is not None else None
        if candidate is None or RECOMPUTE not in candidate.modes:
            raise RecomputeMismatch(
                f"plan: recomputes {name}, which "
                + ("this model has no op of" if node is None else "its backward cannot make again")
                + "; plan again with this version"
            )
        ops = moments.setdefault(candidate.rematerialise - 1, set())  # 1-based positions
        ops.update((node, *candidate.closure))
    position = {node: index for index, node in enumerate(graph.order)}
    made: dict[int, list[fx.Node]] = {}
    for moment, ops in moments.items():
        with_items = ops | {
            user for op in ops for user in op.users if user.target is operator.getitem and user in position
        }
        made[moment] = sorted(with_items, key=position.__getitem__)
    return made


def _drops(entries: Sequence[Entry], kept: set[fx.Node]) -> list[list[fx.Node]]:
    """Per run, the op values whose last reader it is (a value no run reads goes after the run that made
    it; ``kept`` ones and the step's placeholders never). A value made again is a new one: its first copy
    goes after the first copy's last reader."""
    made_by: dict[fx.Node, int] = {}  # node -> the run that made the copy readers now get
    last: dict[tuple[fx.Node, int], int] = {}  # (node, run that made it) -> its last reader
    for index, entry in enumerate(entries):
        for source in entry.node.all_input_nodes:
            if source in made_by:
                last[(source, made_by[source])] = index
        made_by[entry.node] = index
        last.setdefault((entry.node, index), index)
    drops: list[list[fx.Node]] = [[] for _ in entries]
    for (node, _), index in last.items():
        if node not in kept:
            drops[index].append(node)
    return drops


__all__ = ["Entry", "RecomputeMismatch", "schedule"]
