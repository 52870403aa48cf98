"""Embedding lookup and its weight gradient (PyTorch's ``_embedding_ops.py``).

``embedding(weight [V, D], indices [...]) -> [..., D]``:

- column-wise: ``weight`` ``S(1)``, indices whole -> output sharded on its last dim;
- batch: ``weight`` whole, indices ``S(i)`` -> output ``S(i)``;
- row-wise: ``weight`` ``S(0)``, indices whole -> each rank looks up the rows it holds and zeroes the
  others, a partial sum (DTensor's ``MaskPartial``, our ``P(mask)``). DTensor runs it on one mesh
  axis only, and its mask cannot be applied once indices sharded on a later axis have been gathered,
  so those combinations are filtered out. A ``MaskPartial`` is not a plain ``P`` downstream: DTensor
  reduces it before a pointwise op reads it and cannot carry it through ``view``/``select``/``split``
  (its mask keeps the indices' shape). No rule accepts ``P(mask)`` as an input, so every consumer
  pays the all-reduce or reduce-scatter right after the lookup.

``embedding_dense_backward(grad [..., D], indices [...], V, …) -> [V, D]``:

- column-wise: ``grad`` sharded on its last dim -> ``S(1)``;
- batch: ``grad`` and indices ``S(i)`` -> each rank scatters its part, a partial sum; not when
  ``scale_grad_by_freq``, which divides by counts of the whole batch;
- a partial ``grad`` gives a partial weight gradient.
"""

from __future__ import annotations

import numpy as np
import torch

from strategies.ops.registry import OpInfo, Row, register
from strategies.placement import P_MASK, P, R

aten = torch.ops.aten


def _mask_partial_executable(info: OpInfo, out_specs: np.ndarray, in_specs: np.ndarray) -> np.ndarray:
    """Keep row-wise lookups (``P`` output) with the vocabulary cut over one axis and no indices shard
    on an axis after it: DTensor refuses the first ("MaskBuffer has been materialized"), and cannot
    reduce the second (the mask no longer matches the gathered output)."""
    partial = out_specs[:, 0, :] == P_MASK
    after = (np.cumsum(partial, axis=1) > 0) & ~partial
    indices_after = ((in_specs[:, 1, :] >= 0) & after).any(axis=1)
    return (partial.sum(axis=1) <= 1) & ~indices_after


@register(aten.embedding.default, filter=_mask_partial_executable)
def embedding_rules(info: OpInfo) -> list[Row]:
    indices = info.inputs[1]
    rows: list[Row] = [[indices.ndim, 1, R], [P_MASK, 0, R]]
    return rows + [[i, R, i] for i in range(indices.ndim)]


@register(aten.embedding_dense_backward.default)
def embedding_dense_backward_rules(info: OpInfo) -> list[Row]:
    grad, indices = info.inputs
    rows: list[Row] = [[1, grad.ndim - 1, R], [P, P, R]]
    if not info.arg(4, "scale_grad_by_freq", False):
        rows += [[P, i, i] for i in range(indices.ndim)]
    return rows
