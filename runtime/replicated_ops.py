"""Ops DTensor has no sharding strategy for, run replicated as the plan says.

The planner replicates an op that neither autoshard nor PyTorch has a rule for (its warning "no sharding
strategy for aten.fill_.Tensor: 1 node(s) replicated"): the plan gives it every input and output ``R``.
DTensor refuses such an op even then ("Operator aten.fill_.Tensor does not have a sharding strategy
registered", T5's ``_shift_right``), although on replicated inputs every rank holds the whole tensors and
the op needs no rule at all: :func:`run_replicated` runs it on each rank's local tensors and wraps the results
as replicated DTensors, which is what DTensor itself does for an all-replicate strategy. Any op the plan
replicates runs so, not only the ones met so far; an in-place op (``fill_``, ``masked_fill_``) mutates the
local tensor of its DTensor argument and hands that DTensor back, so later readers of either see the change.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.tensor import DTensor, Replicate
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

NO_RULE = "does not have a sharding strategy registered"
"""What DTensor's sharding propagator says of an op it has no strategy for."""


def lacks_rule(error: BaseException) -> bool:
    """Whether DTensor refused an op for want of a sharding strategy (and not for its inputs' placements)."""
    return isinstance(error, NotImplementedError) and NO_RULE in str(error)


def run_replicated(op: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    """``op(*args, **kwargs)`` on the local tensors of its replicated DTensor arguments, each tensor result a
    replicated DTensor on their mesh (an argument the op returns, in place, is handed back as itself).
    Refuses arguments placed otherwise: without a rule, nothing says how the op would combine pieces."""
    dtensors = [leaf for leaf in tree_flatten((args, kwargs))[0] if isinstance(leaf, DTensor)]
    if not dtensors:
        return op(*args, **kwargs)
    placed = sorted(
        {str(tuple(d.placements)) for d in dtensors if not all(p.is_replicate() for p in d.placements)}
    )
    if placed:
        raise ValueError(
            f"DTensor has no sharding strategy for {op} and its inputs are not all replicated "
            f"({', '.join(placed)}): only a replicated op runs without a rule"
        )
    mesh = dtensors[0].device_mesh
    owner = {id(d._local_tensor): d for d in dtensors}  # an in-place result is its argument's local tensor
    local_args, local_kwargs = tree_map(_local, (args, kwargs))
    result = op(*local_args, **local_kwargs)
    leaves, spec = tree_flatten(result)
    wrapped = [_wrapped(leaf, owner, mesh) for leaf in leaves]
    return tree_unflatten(wrapped, spec)


def _local(value: Any) -> Any:
    """A DTensor's local tensor itself (no copy, so an in-place op writes into the DTensor)."""
    return value._local_tensor if isinstance(value, DTensor) else value


def _wrapped(value: Any, owner: dict[int, DTensor], mesh: Any) -> Any:
    if not isinstance(value, torch.Tensor):
        return value
    if id(value) in owner:
        return owner[id(value)]
    return DTensor.from_local(value, mesh, [Replicate()] * mesh.ndim, run_check=False)
