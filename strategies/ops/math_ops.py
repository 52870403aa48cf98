"""Reductions, softmax, normalisation and the negative log-likelihood loss (PyTorch's ``_math_ops.py``).

Shared generators, one mesh axis at a time:

- :func:`reduction_rules`: a kept dim may be sharded (its output dim shifts left past reduced dims
  unless ``keepdim``); a reduced dim may be sharded when the reduction combines across shards,
  giving a partial output of that kind (``sum -> P``, ``mean -> P(avg)``, ``amax -> P(max)``,
  ``amin -> P(min)``); reductions that do not combine so (``var``, ``max.dim``'s indices) leave it whole;
- :func:`batch_dim_rules`: ops that act along some dims (softmax's dim, layer norm's normalised
  dims, the class dim of a loss) and independently over the others shard only the others.

``P(avg)`` is exact only when every shard holds as many elements, so a mean may shard a reduced dim
only where it splits evenly (DTensor itself replicates an unevenly sharded reduced dim before a mean).
``amax``/``amin`` obey the same filter: an uneven split can leave a shard empty (6 over 4 ranks:
2, 2, 2, 0) and the max of an empty shard raises. Kept dims may split unevenly in both.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from strategies.ops.registry import OpInfo, Row, register
from strategies.placement import NONE, P_AVG, P_MAX, P_MIN, P, R

aten = torch.ops.aten

NLL_REDUCTION_NONE, NLL_REDUCTION_MEAN, NLL_REDUCTION_SUM = 0, 1, 2


def reduced_dims(dims: Any, ndim: int) -> list[int]:
    """Normalised reduced dims; ``None`` or an empty list reduce every dim (torch's convention)."""
    if dims is None or (isinstance(dims, Sequence) and len(dims) == 0):
        return list(range(ndim))
    dims = [dims] if isinstance(dims, int) else list(dims)
    return sorted({d % ndim for d in dims}) if ndim else []


def reduction_rules(
    ndim: int,
    dims: Sequence[int],
    keepdim: bool,
    reduced: int | None,
    outputs: int = 1,
    partial_passthrough: bool = False,
) -> list[Row]:
    """Rows ``[outputs..., input]`` of a reduction of an ``ndim``-dim input over ``dims``.

    ``reduced`` is the placement a sharded reduced dim leaves on the outputs (``None``: such a row
    is not emitted); ``partial_passthrough`` adds ``P -> P`` for reductions linear in the input (sum).
    """
    rows: list[Row] = []
    for dim in range(ndim):
        if dim in dims:
            if reduced is not None:
                rows.append([reduced] * outputs + [dim])
        else:
            out_dim = dim if keepdim else dim - sum(1 for d in dims if d < dim)
            rows.append([out_dim] * outputs + [dim])
    if partial_passthrough:
        rows.append([P] * (outputs + 1))
    return rows


def batch_dim_rules(ndim: int, skip: Sequence[int], width: int) -> list[Row]:
    """Rows sharding one dim ``d`` (not in ``skip``) on all ``width`` slots at once."""
    return [[dim] * width for dim in range(ndim) if dim not in skip]


# -------------------------------------------------------------------------------------- reductions


def _dims_and_keepdim(info: OpInfo, keepdim_index: int = 2) -> tuple[list[int], bool]:
    """Reduced dims and ``keepdim`` of ``op(self, dim=None, keepdim=False, ...)`` or ``op(self)``."""
    ndim = info.inputs[0].ndim
    if not _has_dim_arg(info):
        return list(range(ndim)), False
    return reduced_dims(info.arg(1, "dim"), ndim), bool(info.arg(keepdim_index, "keepdim", False))


def _has_dim_arg(info: OpInfo) -> bool:
    arguments = info.op._schema.arguments
    return len(arguments) > 1 and arguments[1].name == "dim"


def _reduction(
    info: OpInfo, reduced: int | None, partial_passthrough: bool = False, keepdim_index: int = 2
) -> list[Row]:
    """Rules for ``op(self, dim=None, keepdim=False, ...)`` overloads (``dim`` at 1, ``keepdim`` at 2)."""
    if _has_dim_arg(info) and _dtensor_misreads_empty_dims(info):
        return [[P, P]] if partial_passthrough else []
    dims, keepdim = _dims_and_keepdim(info, keepdim_index)
    return reduction_rules(
        info.inputs[0].ndim, dims, keepdim, reduced, partial_passthrough=partial_passthrough
    )


def _dtensor_misreads_empty_dims(info: OpInfo) -> bool:
    """``sum(x, [])``: an explicit empty dim list reduces every dim, but DTensor reads it as reducing
    none and labels the 0-d result with the input's shard. (Where ``[]`` is the schema's default, as
    for ``amax``, the argument is dropped before DTensor sees it and all is well.)"""
    dims = info.arg(1, "dim")
    if dims is None or isinstance(dims, int) or len(dims) > 0:
        return False
    schema_arg = info.op._schema.arguments[1]
    return not (schema_arg.has_default_value() and schema_arg.default_value == [])


def splits_evenly(size: int, specs: np.ndarray, dim: int, mesh_shape: Sequence[int]) -> np.ndarray:
    """``[strategy]``: does a dim of ``size``, sharded per ``specs`` (``[strategy, axis]``), split evenly?"""
    pieces = np.where(specs == dim, np.asarray(mesh_shape, dtype=np.int64), 1).prod(axis=1)
    return size % pieces == 0


def even_reduced_dims(info: OpInfo, out_specs: np.ndarray, in_specs: np.ndarray) -> np.ndarray:
    """Filter: every reduced dim of the input that is sharded splits evenly."""
    dims, _ = _dims_and_keepdim(info)
    keep = np.ones(len(in_specs), dtype=bool)
    for dim in dims:
        keep &= splits_evenly(info.inputs[0].shape[dim], in_specs[:, 0], dim, info.mesh.shape)
    return keep


@register(aten.sum.default, aten.sum.dim_IntList)
def sum_rules(info: OpInfo) -> list[Row]:
    """Partial sums of the shards add up to the sum; a partial input sums to a partial output."""
    return _reduction(info, P, partial_passthrough=True)


@register(aten.mean.default, aten.mean.dim, filter=even_reduced_dims)
def mean_rules(info: OpInfo) -> list[Row]:
    """The mean of equal-sized shards is the average of their means: ``P(avg)``."""
    return _reduction(info, P_AVG)


@register(aten.amax.default, aten.max.default, filter=even_reduced_dims)
def amax_rules(info: OpInfo) -> list[Row]:
    """Reduced dims split evenly: 6 over 4 ranks leaves one shard empty, and the max of nothing raises."""
    return _reduction(info, P_MAX)


@register(aten.amin.default, aten.min.default, filter=even_reduced_dims)
def amin_rules(info: OpInfo) -> list[Row]:
    """Reduced dims split evenly, as for ``amax``."""
    return _reduction(info, P_MIN)


@register(aten.any.default, aten.any.dim, aten.any.dims, aten.all.default, aten.all.dim, aten.all.dims)
def logical_reduction_rules(info: OpInfo) -> list[Row]:
    """Kept dims only: booleans have no partial placement autoshard plans with."""
    return _reduction(info, None)


@register(aten.argmax.default, aten.argmin.default)
def arg_reduction_rules(info: OpInfo) -> list[Row]:
    """Kept dims only: an index found in one shard is local to it."""
    return _reduction(info, None)


@register(aten.max.dim, aten.min.dim)
def max_dim_rules(info: OpInfo) -> list[Row]:
    """``(values, indices)`` over one dim: kept dims only, the indices are local to a shard."""
    ndim = info.inputs[0].ndim
    dims = reduced_dims(info.arg(1, "dim"), ndim)
    return reduction_rules(ndim, dims, bool(info.arg(2, "keepdim", False)), None, outputs=2)


@register(aten.var.correction, aten.std.correction)
def variance_rules(info: OpInfo) -> list[Row]:
    """Kept dims only: variances of shards do not combine into a partial placement."""
    return _reduction(info, None, keepdim_index=3)


# ----------------------------------------------------------------------------------------- softmax


@register(aten._softmax.default, aten._log_softmax.default, aten._safe_softmax.default)
def softmax_rules(info: OpInfo) -> list[Row]:
    """Any dim but the softmax dim, which every shard needs whole."""
    ndim = info.inputs[0].ndim
    return batch_dim_rules(ndim, reduced_dims(info.arg(1, "dim"), ndim), width=2)


@register(aten._softmax_backward_data.default, aten._log_softmax_backward_data.default)
def softmax_backward_rules(info: OpInfo) -> list[Row]:
    """``(grad_output, output) -> grad_input``, all sharded alike on a dim other than the softmax dim."""
    ndim = info.inputs[0].ndim
    return batch_dim_rules(ndim, reduced_dims(info.arg(2, "dim"), ndim), width=3)


# --------------------------------------------------------------------------------------- norms


def _leading_dims(info: OpInfo, input_index: int, normalized_shape_index: int) -> int:
    """How many leading dims of the input are not normalised (the dims that may be sharded)."""
    return info.inputs[input_index].ndim - len(info.arg(normalized_shape_index, "normalized_shape"))


def _norm_forward(info: OpInfo) -> list[Row]:
    """``(out, statistics...)`` and the input share a leading dim; weight and bias stay whole."""
    n_out = len(info.outputs)
    params = len(info.inputs) - 1
    return [[d] * (n_out + 1) + [R] * params for d in range(_leading_dims(info, 0, 1))]


def _norm_backward(info: OpInfo, activations: int) -> list[Row]:
    """``grad_input`` follows the leading dim; ``grad_weight``/``grad_bias`` sum over it, so are ``P``.

    ``activations`` counts the tensors sharded with ``grad_output`` (``grad_out, input`` and the saved
    statistics); the remaining tensor arguments are parameters, kept whole.
    """
    params = len(info.inputs) - activations
    grads_of_params = [P] * (len(info.outputs) - 1)
    return [
        [d, *grads_of_params] + [d] * activations + [R] * params for d in range(_leading_dims(info, 1, 2))
    ]


@register(aten.native_layer_norm.default, aten._fused_rms_norm.default)
def norm_rules(info: OpInfo) -> list[Row]:
    return _norm_forward(info)


@register(aten.native_layer_norm_backward.default)
def layer_norm_backward_rules(info: OpInfo) -> list[Row]:
    """``(grad_out, input, mean, rstd, weight?, bias?) -> (grad_input, grad_weight, grad_bias)``."""
    return _norm_backward(info, activations=4)


@register(aten._fused_rms_norm_backward.default)
def rms_norm_backward_rules(info: OpInfo) -> list[Row]:
    """``(grad_out, input, rstd, weight?) -> (grad_input, grad_weight)``."""
    return _norm_backward(info, activations=3)


# --------------------------------------------------------------------------------------- nll loss


def even_batch_for_mean_loss(info: OpInfo, out_specs: np.ndarray, in_specs: np.ndarray) -> np.ndarray:
    """Filter: a ``mean`` loss splits the batch evenly (DTensor refuses otherwise: a biased mean)."""
    if info.arg(3, "reduction") != NLL_REDUCTION_MEAN or info.inputs[1].ndim == 0:
        return np.ones(len(in_specs), dtype=bool)
    return splits_evenly(info.inputs[1].shape[0], in_specs[:, 1], 0, info.mesh.shape)


@register(aten.nll_loss_forward.default, filter=even_batch_for_mean_loss)
def nll_loss_forward_rules(info: OpInfo) -> list[Row]:
    """``(self [N, C], target [N], weight? [C]) -> (loss, total_weight)``: shard the batch dim ``N``.

    ``none`` keeps per-sample losses sharded; ``sum`` gives partial sums of loss and total weight.
    ``mean`` gives the loss as ``P(avg)`` of per-shard means, exact only when every shard has the same
    total weight: so with an even split, not with class weights, and (as in DTensor) only while no
    target equals ``ignore_index``, which a plan cannot see.
    """
    if info.inputs[0].ndim < 2:
        return []
    reduction = info.arg(3, "reduction")
    weighted = len(info.inputs) == 3
    params = [R] if weighted else []
    if reduction == NLL_REDUCTION_NONE:
        return [[0, R, 0, 0, *params]]
    if reduction == NLL_REDUCTION_MEAN and weighted:
        return []
    loss = P_AVG if reduction == NLL_REDUCTION_MEAN else P
    return [[loss, P, 0, 0, *params]]


@register(aten.nll_loss_backward.default)
def nll_loss_backward_rules(info: OpInfo) -> list[Row]:
    """``(grad_output, self, target, weight?, total_weight) -> grad_input``, sharded on the batch dim.

    ``grad_output`` is sharded like the loss for ``none`` and a whole scalar otherwise; ``total_weight``
    must be whole for ``mean`` (it divides every sample's gradient) and is not read otherwise.
    """
    if info.inputs[1].ndim < 2:
        return []
    reduction = info.arg(4, "reduction")
    weighted = len(info.inputs) == 5
    grad_output = 0 if reduction == NLL_REDUCTION_NONE else R
    total_weight = R if reduction == NLL_REDUCTION_MEAN else NONE
    return [[0, grad_output, 0, 0, *([R] if weighted else []), total_weight]]


def _even_mean_loss_dims(info: OpInfo, out_specs: np.ndarray, in_specs: np.ndarray) -> np.ndarray:
    """Filter: a ``mean`` loss splits every sharded dim evenly (``P(avg)`` of uneven shards is biased)."""
    keep = np.ones(len(in_specs), dtype=bool)
    if info.arg(2, "reduction", 1) != NLL_REDUCTION_MEAN:
        return keep
    for dim, size in enumerate(info.inputs[0].shape):
        keep &= splits_evenly(size, in_specs[:, 0], dim, info.mesh.shape)
    return keep


@register(aten.mse_loss.default, filter=_even_mean_loss_dims)
def mse_loss_rules(info: OpInfo) -> list[Row]:
    """``mse_loss(self, target)``: both sharded alike on any dim; ``none`` keeps the shard, ``sum`` gives
    ``P``, ``mean`` ``P(avg)`` (DTensor runs it through its decomposition)."""
    reduction = info.arg(2, "reduction", 1)
    loss = {NLL_REDUCTION_NONE: None, NLL_REDUCTION_MEAN: P_AVG}.get(reduction, P)
    return [[d if loss is None else loss, d, d] for d in range(info.inputs[0].ndim)]


@register(aten.mse_loss_backward.default)
def mse_loss_backward_rules(info: OpInfo) -> list[Row]:
    """``(grad_output, self, target) -> grad_input``: pointwise; a summed loss's gradient is a whole scalar.
    Not for ``mean``: DTensor's decomposition divides by the local element count (measured: wrong values)."""
    reduction = info.arg(3, "reduction", 1)
    if reduction == NLL_REDUCTION_MEAN:
        return []
    keeps_shape = reduction == NLL_REDUCTION_NONE
    return [[d, d if keeps_shape else R, d, d] for d in range(info.inputs[1].ndim)]
