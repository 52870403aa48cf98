"""From an op and its argument shapes to its full list of strategies with costs.

Steps, each in one place:

1. rules: the op's single-axis rows (:mod:`strategies.ops.registry`; PyTorch's own single-axis rules or
   replicate-only as fallbacks, :mod:`strategies.ops.fallback`), plus the all-replicate row;
2. expand: the product of the rows over the mesh axes (``rows ** ndim`` combinations), as one
   ``[strategy, tensor, axis]`` integer array;
3. filter: a tensor dim may only be sharded over axes whose sizes multiply to at most its size
   (DTensor's ``is_tensor_shardable``); no tensor is partial under two reductions at once; rules
   may add their own filter; duplicates removed; all-replicate always stays;
4. cost (vectorised over strategies):
   ``memory_bytes`` = sum over outputs of the largest local piece's bytes;
   ``compute_s`` the op on its local shapes as the hardware achieves it, per op family
   (:mod:`strategies.cost.compute`: GEMMs by tile and wave quantisation, flash attention by sequence and head
   dim, the rest at the achieved memory rate; zero for views).

Results are cached by (op, argument shapes/dtypes/values, mesh).
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch.utils._pytree import tree_map

from strategies.cost.comm import dim_pieces, local_sizes, redistribute_matrix
from strategies.cost.compute import compute_seconds, is_causal, op_family
from strategies.cost.mesh import Mesh
from strategies.ops.registry import OpInfo, OpRules, lookup
from strategies.placement import NONE, P_MASK, PARTIALS, R, spec_text
from strategies.tensor_meta import TensorMeta, dtype_name, flatten_tensors, meta_outputs

log = logging.getLogger("autoshard.strategies")


@dataclass
class OpStrategies:
    """Every way one op can run on a mesh: DTensor's ``OpStrategy``, as arrays."""

    op: Any
    mesh: Mesh
    inputs: tuple[TensorMeta, ...]
    outputs: tuple[TensorMeta | None, ...]
    output_specs: np.ndarray
    """``int16 [strategy, output, axis]``; ``NONE`` rows for non-tensor outputs."""
    input_specs: np.ndarray
    """``int16 [strategy, tensor argument, axis]``."""
    compute_s: np.ndarray
    memory_bytes: np.ndarray
    source: str
    """``autoshard`` (our rules), ``pytorch`` (PyTorch's single-axis rules) or ``replicate`` (fallback)."""
    flops: np.ndarray | None = None
    """FLOPs per strategy on local shapes, as counted (every query-key pair of attention); 0 for views."""

    def __len__(self) -> int:
        return len(self.compute_s)

    def redistribute_from(self, input_index: int, src_specs: np.ndarray) -> np.ndarray:
        """``[len(src_specs), len(self)]`` seconds to bring argument ``input_index`` to each spec."""
        meta = self.inputs[input_index]
        return redistribute_matrix(
            self.mesh, meta.shape, meta.itemsize, src_specs, self.input_specs[:, input_index, :]
        )

    def redistribute_from_replicate(self) -> np.ndarray:
        """``[tensor argument, strategy]`` seconds to reach each strategy's input spec from all-``R``."""
        replicated = np.full((1, self.mesh.ndim), R, dtype=np.int16)
        if not self.inputs:
            return np.zeros((0, len(self)))
        return np.stack([self.redistribute_from(i, replicated)[0] for i in range(len(self.inputs))])

    def describe(self, index: int) -> dict[str, Any]:
        """One strategy in the placement notation of docs/plan-format.md."""
        return {
            "output": [
                None if meta is None else spec_text(self.output_specs[index, k])
                for k, meta in enumerate(self.outputs)
            ],
            "inputs": [spec_text(self.input_specs[index, k]) for k in range(len(self.inputs))],
            "compute_s": float(self.compute_s[index]),
            "memory_bytes": int(self.memory_bytes[index]),
        }


_CACHE: dict[Any, OpStrategies] = {}


def op_strategies(
    op: Any,
    args: tuple,
    kwargs: dict | None,
    mesh: Mesh,
    outputs: tuple[TensorMeta | None, ...] | None = None,
) -> OpStrategies:
    """All strategies of ``op(*args, **kwargs)`` on ``mesh``; tensors in ``args`` are :class:`TensorMeta`.

    ``outputs`` may be given when known (from a captured graph); otherwise the op runs on meta tensors.
    """
    kwargs = kwargs or {}
    key = (op, _freeze(args), _freeze(kwargs), mesh)
    hit = _CACHE.get(key)
    if hit is not None:
        return hit
    if outputs is None:
        outputs = meta_outputs(op, args, kwargs)
    info = OpInfo(op, tuple(args), dict(kwargs), tuple(flatten_tensors((args, kwargs))), tuple(outputs), mesh)
    rules, rows, source = _rules_for(info)
    result = _build(info, mesh, rules, rows, source)
    _CACHE[key] = result
    return result


def clear_cache() -> None:
    _CACHE.clear()


def _freeze(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    return value


def _rules_for(info: OpInfo) -> tuple[OpRules | None, list, str]:
    from strategies.ops.fallback import pytorch_rows

    rules = lookup(info.op)
    if rules is not None:
        return rules, list(rules.rules(info)), "autoshard"
    rows = pytorch_rows(info)
    if rows is not None:
        return None, rows, "pytorch"
    log.warning("no sharding strategy for %s: replicate only", info.op)
    return None, [], "replicate"


def _build(info: OpInfo, mesh: Mesh, rules: OpRules | None, rows: list, source: str) -> OpStrategies:
    n_out, n_in = len(info.outputs), len(info.inputs)
    metas: list[TensorMeta | None] = [*info.outputs, *info.inputs]
    replicate = [NONE if m is None else R for m in metas]
    add_replicate = rules is None or rules.add_replicate
    table = [replicate] if add_replicate else []
    for row in rows:
        row = [NONE if c is None else int(c) for c in row]
        if len(row) != n_out + n_in:
            raise ValueError(
                f"{info.op}: rule {row} has {len(row)} entries, expected {n_out} outputs + "
                f"{n_in} tensor arguments"
            )
        table.append([NONE if m is None else c for c, m in zip(row, metas, strict=True)])
    base = _unique_rows(np.array(table or [replicate], dtype=np.int16))
    combos = np.array(list(itertools.product(range(len(base)), repeat=mesh.ndim)), dtype=np.int64)
    specs = base[combos].transpose(0, 2, 1)  # [strategy, tensor, axis]
    keep = _shardable(specs, metas, mesh, even_only=rules is not None and rules.even_only)
    keep &= _one_reduction_per_tensor(specs)
    if rules is not None and rules.filter is not None:
        keep &= rules.filter(info, specs[:, :n_out], specs[:, n_out:])
    if add_replicate:
        keep[0] = True  # all-replicate always runs
    elif not keep.any():
        raise ValueError(f"{info.op}: none of its rules fits arguments {[str(m) for m in info.inputs]}")
    specs = specs[keep]
    specs = specs[np.sort(np.unique(specs.reshape(len(specs), -1), axis=0, return_index=True)[1])]
    local = _local_shapes(specs, metas, mesh)
    compute, flops = _compute_s(info, mesh, rules, local, metas)
    out_bytes = np.zeros(len(specs), dtype=np.int64)
    for k, meta in enumerate(info.outputs):
        if meta is not None:
            out_bytes += local[k].prod(axis=1, dtype=np.int64) * meta.itemsize
    return OpStrategies(
        info.op,
        mesh,
        info.inputs,
        info.outputs,
        specs[:, :n_out].copy(),
        specs[:, n_out:].copy(),
        compute,
        out_bytes,
        source,
        flops,
    )


def _unique_rows(rows: np.ndarray) -> np.ndarray:
    """Distinct rows in the order they first appear (all-replicate first, then the rules' order)."""
    first = np.unique(rows, axis=0, return_index=True)[1]
    return rows[np.sort(first)]


def _shard_counts(specs: np.ndarray, slot: int, ndim: int, mesh: Mesh) -> np.ndarray:
    """``[strategy, dim]`` number of pieces each dim of tensor ``slot`` is cut into."""
    return dim_pieces(specs[:, slot, :], ndim, mesh.shape)


def _shardable(specs: np.ndarray, metas: list[TensorMeta | None], mesh: Mesh, even_only: bool) -> np.ndarray:
    keep = np.ones(len(specs), dtype=bool)
    for slot, meta in enumerate(metas):
        if meta is None:
            continue
        s = specs[:, slot, :]
        keep &= ~((s >= meta.ndim) & (s != NONE)).any(axis=1)
        counts = _shard_counts(specs, slot, meta.ndim, mesh)
        shape = np.asarray(meta.shape, dtype=np.int64)
        keep &= (counts <= np.maximum(shape, 1)).all(axis=1) & ((counts == 1) | (shape > 0)).all(axis=1)
        if even_only:
            keep &= (shape % counts == 0).all(axis=1)
    return keep


def _one_reduction_per_tensor(specs: np.ndarray) -> np.ndarray:
    """No tensor partial under two reductions at once (``[P, P(max)]``): DTensor refuses mixed kinds."""
    kinds = sum((specs == p).any(axis=2).astype(np.int64) for p in (*PARTIALS, P_MASK))
    return (kinds <= 1).all(axis=1)


def _local_shapes(specs: np.ndarray, metas: list[TensorMeta | None], mesh: Mesh) -> list[np.ndarray]:
    """Per slot, ``[strategy, dim]`` sizes of the largest local piece (``ceil(size / pieces)``)."""
    out = []
    for slot, meta in enumerate(metas):
        if meta is None:
            out.append(np.zeros((len(specs), 0), dtype=np.int64))
            continue
        out.append(local_sizes(specs[:, slot, :], meta.shape, mesh.shape))
    return out


def _compute_s(
    info: OpInfo, mesh: Mesh, rules: OpRules | None, local: list[np.ndarray], metas: list[TensorMeta | None]
) -> tuple[np.ndarray, np.ndarray]:
    """(seconds, FLOPs) per strategy: the op on its local shapes as the hardware achieves it
    (:mod:`strategies.cost.compute`); a view costs nothing."""
    n = len(local[0]) if local else 1
    if rules is not None and rules.kind == "view":
        return np.zeros(n), np.zeros(n)
    moved = np.zeros(n)
    for slot, meta in enumerate(metas):
        if meta is not None:
            moved += local[slot].prod(axis=1) * float(meta.itemsize)
    dtype = next((m.dtype for m in info.inputs if m.dtype.is_floating_point), None) or (
        info.outputs[0].dtype if info.outputs and info.outputs[0] is not None else None
    )
    flops = _flops(info, rules, local, metas)
    family = op_family(info.op)
    n_out = len(info.outputs)
    seconds = compute_seconds(
        mesh.hardware,
        family,
        dtype_name(dtype) if dtype is not None else "float32",
        flops,
        moved,
        output_shape=local[0] if n_out and metas[0] is not None else None,
        query_shape=local[n_out] if len(local) > n_out else None,
        causal=is_causal(info.op, info.args, info.kwargs),
    )
    return seconds, flops


def _flops(
    info: OpInfo, rules: OpRules | None, local: list[np.ndarray], metas: list[TensorMeta | None]
) -> np.ndarray:
    """FLOPs per strategy on local shapes, computed once per distinct combination of local shapes."""
    n_out = len(info.outputs)
    formula = rules.flops if rules is not None and rules.flops is not None else _torch_flops(info)
    if formula is None:  # one operation per element of the largest output
        sizes = [local[k].prod(axis=1) for k, m in enumerate(info.outputs) if m is not None]
        return np.max(sizes, axis=0).astype(np.float64) if sizes else np.zeros(len(local[0]) if local else 1)
    stacked = np.concatenate([a for a in local], axis=1) if local else np.zeros((1, 0), dtype=np.int64)
    unique, inverse = np.unique(stacked, axis=0, return_inverse=True)
    widths = [a.shape[1] for a in local]
    bounds = np.cumsum([0, *widths])
    values = np.empty(len(unique))
    for u, row in enumerate(unique):
        shapes = [tuple(int(v) for v in row[bounds[k] : bounds[k + 1]]) for k in range(len(widths))]
        outs = [None if metas[k] is None else shapes[k] for k in range(n_out)]
        values[u] = formula(info, shapes[n_out:], outs)
    return values[inverse.ravel()]


def _torch_flops(info: OpInfo) -> Any:
    """``torch.utils.flop_counter``'s formula for the op, called with local shapes in place of tensors."""
    from torch.utils.flop_counter import flop_registry

    fn = flop_registry.get(getattr(info.op, "overloadpacket", info.op))
    if fn is None:
        return None

    def formula(info: OpInfo, in_shapes: list[tuple[int, ...]], out_shapes: list) -> float:
        shapes = iter(in_shapes)
        args = tree_map(lambda x: next(shapes) if isinstance(x, TensorMeta) else x, info.args)
        kwargs = tree_map(lambda x: next(shapes) if isinstance(x, TensorMeta) else x, info.kwargs)
        out = out_shapes[0] if len(out_shapes) == 1 else tuple(out_shapes)
        return float(fn(*args, out_val=out, **kwargs))

    return formula
