"""The op registry: ``@register(aten.mm.default)`` on a function giving an op's single-axis rules.

A *rule* is one row of placement codes for one mesh axis: the outputs first, then every tensor
argument in the order they appear when the arguments are flattened. ``NONE`` marks a non-tensor
output, or an input the strategy does not read (the unselected members of the tuple
``operator.getitem`` picks from): no placement is asked of it. ``[S(0), S(0), R]`` for ``mm``
says: shard the output's dim 0 and ``self``'s dim 0, keep ``mat2`` whole. Rules are expanded to the
full mesh by product over axes, filtered once, and costed in :mod:`strategies.ops.generate`. The
all-replicate rule is always added, so rule functions list only the sharded ways.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from strategies.tensor_meta import TensorMeta

Row = Sequence[int]
RuleFn = Callable[["OpInfo"], list[Row]]
SpecFilter = Callable[["OpInfo", np.ndarray, np.ndarray], np.ndarray]
FlopsFn = Callable[["OpInfo", list[tuple[int, ...]], list[tuple[int, ...] | None]], float]


@dataclass(frozen=True)
class OpInfo:
    """What a rule function sees: the op, its arguments (TensorMeta for tensors) and outputs."""

    op: Any
    args: tuple
    kwargs: dict
    inputs: tuple[TensorMeta, ...]
    outputs: tuple[TensorMeta | None, ...]
    mesh: Any = None
    """The :class:`~strategies.cost.mesh.Mesh` strategies are generated for (filters may need axis sizes)."""

    def arg(self, index: int, name: str | None = None, default: Any = None) -> Any:
        """Positional argument ``index``, else keyword ``name``, else the schema default, else ``default``."""
        if index < len(self.args):
            return self.args[index]
        if name is not None and name in self.kwargs:
            return self.kwargs[name]
        schema_args = getattr(getattr(self.op, "_schema", None), "arguments", [])
        if index < len(schema_args) and schema_args[index].has_default_value():
            return schema_args[index].default_value
        return default


@dataclass(frozen=True)
class OpRules:
    rules: RuleFn
    kind: str = "compute"
    """``compute`` (roofline cost) or ``view`` (an alias: no kernel, no cost)."""
    filter: SpecFilter | None = None
    """Optional extra validity check on expanded specs, returns a boolean mask over strategies."""
    flops: FlopsFn | None = None
    """FLOPs of one strategy's local shapes; default ``torch.utils.flop_counter`` or one per element."""
    even_only: bool = False
    """Reject uneven shards (views that cannot split unevenly)."""
    add_replicate: bool = True
    """Add the all-replicate row; off when the rules give their own (with ``NONE`` for unread inputs)."""
    extra: dict = field(default_factory=dict)


_REGISTRY: dict[Any, OpRules] = {}


def register(
    *ops: Any,
    kind: str = "compute",
    filter: SpecFilter | None = None,
    flops: FlopsFn | None = None,
    even_only: bool = False,
    add_replicate: bool = True,
) -> Callable[[RuleFn], RuleFn]:
    """Register single-axis rules for one or more aten overloads."""
    if kind not in ("compute", "view"):
        raise ValueError(f"kind must be 'compute' or 'view', got {kind!r}")

    def wrap(fn: RuleFn) -> RuleFn:
        for op in ops:
            _REGISTRY[op] = OpRules(
                fn, kind=kind, filter=filter, flops=flops, even_only=even_only, add_replicate=add_replicate
            )
        return fn

    return wrap


def lookup(op: Any) -> OpRules | None:
    """The rules of ``op``; every family is registered, since importing this module ran ``strategies.ops``."""
    return _REGISTRY.get(op)


def registered_ops() -> list[Any]:
    return list(_REGISTRY)
