"""Registers autoshard's rules with DTensor for ops DTensor has no sharding strategy for.

DTensor cannot run the CPU flash-attention kernels (``_scaled_dot_product_flash_attention_for_cpu`` and its
backward) on DTensors: its sharding propagator has no strategy for them, nor for autoshard's own ops
(``autoshard::einsum``, ``autoshard::grouped_mm``). :func:`register_with_dtensor` gives
it one built from autoshard's own strategy list (:func:`strategies.ops.generate.op_strategies`), so the
placements a plan picks are exactly the ones DTensor accepts: one source of truth.

DTensor redistributes positional arguments to the strategy it selects but never keyword arguments, so
strategies that would need a tensor keyword argument (``attn_mask``) in another placement than it has are
left out; DTensor then picks among the rest (at worst all-replicate), and a keyword tensor placed where no
strategy takes it is an error that names it.
"""

from __future__ import annotations

from typing import Any

import torch

from strategies.cost.mesh import make_mesh
from strategies.ops.einsum_ops import EINSUM
from strategies.ops.generate import OpStrategies, op_strategies
from strategies.ops.grouped_mm_ops import GROUPED_MM
from strategies.placement import NONE, to_dtensor
from strategies.tensor_meta import TensorMeta

aten = torch.ops.aten

BRIDGED_OPS = (
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
    EINSUM,
    GROUPED_MM,
)
"""Ops DTensor runs with autoshard's strategies."""

STATIC_ARGNUM = {EINSUM: 0}
"""Per op, the first positional argument DTensor must hash into its sharding cache key (by default none
are): ``autoshard::einsum``'s strategies depend on its equation."""


def register_with_dtensor() -> None:
    """Make DTensor able to run the ops only autoshard knows how to shard. Safe to call again."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._op_schema import RuntimeSchemaInfo

    propagator = DTensor._op_dispatcher.sharding_propagator
    missing = [op for op in BRIDGED_OPS if propagator.op_strategy_funcs.get(op) is not dtensor_strategy]
    for op in missing:
        keyword_tensors = [a.name for a in op._schema.arguments if a.kwarg_only and _is_tensor(a)]
        schema_info = RuntimeSchemaInfo(
            static_argnum=STATIC_ARGNUM.get(op, 100), static_kwargkey=keyword_tensors
        )
        propagator.register_op_strategy(op, dtensor_strategy, schema_info=schema_info)
    if missing:  # decisions cached before registration (decomposition attempts) no longer hold
        propagator.propagate_op_sharding.cache_clear()


def _is_tensor(argument: Any) -> bool:
    """A schema argument holding a tensor (``Tensor``, ``Tensor?``)."""
    return str(argument.type) in ("Tensor", "Optional[Tensor]")


def dtensor_strategy(op_schema: Any) -> Any:
    """DTensor's ``OpStrategy`` for ``op_schema``: autoshard's strategies for the same shapes and mesh."""
    from torch.distributed.tensor._op_schema import OpSpec, OpStrategy
    from torch.distributed.tensor._ops.utils import generate_redistribute_costs

    device_mesh = op_schema.get_mesh_from_args(validate=False)
    args, kwargs = _metas(op_schema.args_schema), _metas(op_schema.kwargs_schema)
    ours = op_strategies(op_schema.op, args, kwargs, make_mesh(tuple(device_mesh.shape), hardware="cpu"))
    current = [*op_schema.args_strategy, *op_schema.kwargs_strategy]
    first_keyword = len(op_schema.args_strategy)
    specs = []
    for index in range(len(ours)):
        inputs = _input_specs(ours, index, current, device_mesh)
        if any(
            inputs[k].placements != current[k].strategies[0].output_spec.placements
            for k in range(first_keyword, len(current))
        ):
            continue
        costs = [
            generate_redistribute_costs(strategy, spec)
            for strategy, spec in zip(current, inputs, strict=True)
        ]
        specs.append(OpSpec(_output_specs(ours, index, device_mesh), inputs, redistribute_cost=costs))
    if not specs:
        held = {
            name: value.strategies[0].output_spec.placements
            for name, value in op_schema.kwargs_schema.items()
            if isinstance(value, OpStrategy)
        }
        raise ValueError(
            f"{op_schema.op}: no strategy takes the keyword tensors as they are placed ({held}); "
            "DTensor does not redistribute keyword arguments, so redistribute them first"
        )
    return OpStrategy(specs)


def _metas(tree: Any) -> Any:
    """``OpStrategy`` leaves as :class:`TensorMeta` (global shape and dtype), everything else as is."""
    from torch.distributed.tensor._op_schema import OpStrategy

    if isinstance(tree, OpStrategy):
        meta = tree.strategies[0].output_spec.tensor_meta
        return TensorMeta(tuple(int(s) for s in meta.shape), meta.dtype)
    if isinstance(tree, (list, tuple)):
        return type(tree)(_metas(t) for t in tree)
    if isinstance(tree, dict):
        return {k: _metas(v) for k, v in tree.items()}
    return tree


def _input_specs(ours: OpStrategies, index: int, current: list, device_mesh: Any) -> list:
    """DTensor specs of strategy ``index``'s inputs; an input it does not read keeps its placement."""
    from torch.distributed.tensor._dtensor_spec import DTensorSpec

    specs = []
    for k, strategy in enumerate(current):
        held = strategy.strategies[0].output_spec
        codes = ours.input_specs[index, k]
        placements = held.placements if (codes == NONE).any() else to_dtensor(codes)
        specs.append(DTensorSpec(device_mesh, tuple(placements), tensor_meta=held.tensor_meta))
    return specs


def _output_specs(ours: OpStrategies, index: int, device_mesh: Any) -> Any:
    """One DTensor spec per output, ``None`` for a non-tensor output; a bare spec for a single output."""
    from torch.distributed.tensor._dtensor_spec import DTensorSpec

    specs = tuple(
        None if meta is None else DTensorSpec(device_mesh, to_dtensor(ours.output_specs[index, k]))
        for k, meta in enumerate(ours.outputs)
    )
    return specs[0] if len(specs) == 1 else specs
