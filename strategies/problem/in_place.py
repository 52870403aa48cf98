"""Edges whose value an op writes into: they keep their placement.

An in-place op (``copy_``, ``fill_``, ``masked_fill_``: a schema argument ``Tensor(a!)``) writes into the
storage of its argument, and through it into the tensor that argument is a view of: T5's ``_shift_right``
makes ``new_zeros``, then ``slice(...).copy_(labels)`` and ``select(...).fill_(start)`` write the decoder's
input through two views. Moved to another placement first, the op would write into the moved copy and the
base would never see it (the plan then computes with zeros where one process has the labels). So every edge
into a written argument, and every edge along the chain of views from that argument back to its base, is
priced ``inf`` unless both ends have the same placement: the value reaches the op as it is, and the runtime
(which moves an argument only when its placement differs) hands the op the tensor itself.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np
import torch
from torch import fx


def placement_kept(order: list[fx.Node]) -> set[tuple[fx.Node, int]]:
    """``(consumer, flattened tensor argument)`` pairs whose edge must keep its placement: the arguments
    in-place ops write, and the aliased argument of each view on the way back to the written tensor's base."""
    kept: set[tuple[fx.Node, int]] = set()
    pending = [(node, k) for node in order for k in _arguments(node, written=True)]
    while pending:
        node, k = pending.pop()
        if (node, k) in kept:
            continue
        kept.add((node, k))
        source = _sources(node)[k]
        if source is not None and source.op == "call_function":
            pending += [(source, j) for j in _arguments(source, written=False)]
    return kept


def forbid_moves(matrix: np.ndarray, src_specs: np.ndarray, dst_specs: np.ndarray) -> None:
    """Price every ``[producer strategy, consumer strategy]`` pair whose placements differ at ``inf``."""
    differs = (src_specs[:, None, :] != dst_specs[None, :, :]).any(axis=2)
    matrix[differs] = np.inf


def _arguments(node: fx.Node, written: bool) -> list[int]:
    """Flattened tensor arguments (the order of the op's strategies) that ``node`` writes (``written``), or
    that its output is a view of (a view op's aliased input; none for other ops)."""
    schema = getattr(node.target, "_schema", None)
    if node.op != "call_function" or schema is None or node.target is operator.getitem:
        return []
    if not written and not any(
        r.alias_info is not None and not r.alias_info.is_write for r in schema.returns
    ):
        return []
    chosen = {
        a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write == written
    }
    found: list[int] = []
    k = 0
    named = [(a.name, v) for a, v in zip(schema.arguments, node.args, strict=False)]
    for name, value in [*named, *node.kwargs.items()]:
        count = _tensor_count(value)
        if name in chosen:
            found += range(k, k + count)
        k += count
    return found


def _tensor_count(value: Any) -> int:
    """Tensor arguments in ``value``, counted as the op's strategies flatten them."""
    if isinstance(value, fx.Node):
        held = value.meta.get("val")
        if isinstance(held, (tuple, list)):
            return sum(isinstance(v, torch.Tensor) for v in held)
        return int(isinstance(held, torch.Tensor))
    if isinstance(value, (list, tuple)):
        return sum(_tensor_count(v) for v in value)
    if isinstance(value, dict):
        return sum(_tensor_count(v) for v in value.values())
    return 0


def _sources(node: fx.Node) -> list[fx.Node | None]:
    """Per flattened tensor argument, the node that makes it (a ``getitem`` stands for its producer)."""
    found: list[fx.Node | None] = []

    def visit(value: Any) -> None:
        if isinstance(value, fx.Node):
            held = value.meta.get("val")
            if isinstance(held, (tuple, list)):
                found.extend(value for v in held if isinstance(v, torch.Tensor))
            elif isinstance(held, torch.Tensor):
                is_member = value.op == "call_function" and value.target is operator.getitem
                found.append(value.args[0] if is_member else value)
        elif isinstance(value, (list, tuple)):
            for v in value:
                visit(v)
        elif isinstance(value, dict):
            for v in value.values():
                visit(v)

    visit(node.args)
    visit(node.kwargs)
    return found
