"""Pointwise ops: element by element after broadcasting (PyTorch's ``_pointwise_ops.py``).

One generator, :func:`pointwise_rules`, serves every op here. For one mesh axis it gives:

- a shard row per dim ``d`` of the broadcast shape: every tensor output ``S(d)``; each tensor argument
  ``S`` of the dim that lines up with ``d`` (broadcasting aligns shapes from the right), or ``R``
  where the argument has no such dim or is broadcast along it (size 1 against a larger size);
- a partial row per group of arguments the op is *jointly linear* in: ``P`` on the output and on the
  group, ``R`` on the other arguments. ``add(P, P) -> P`` because ``sum_i a_i + sum_i b_i =
  sum_i (a_i + b_i)``; ``mul(P, R) -> P`` because ``(sum_i a_i) b = sum_i a_i b``.

Only ``P`` (sum) passes through: ``P(avg)`` (and ``P(max)``/``P(min)`` through monotone ops) would
also run in DTensor, but nothing upstream produces them often enough to pay for the extra strategies.
Nonlinear ops get shard rows only. The rows are exactly those DTensor's own single-axis rules accept
for these ops, so the plan runs without hidden collectives.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from strategies.ops.registry import OpInfo, Row, register
from strategies.placement import P, R
from strategies.tensor_meta import TensorMeta

aten = torch.ops.aten


def broadcast_dim(arg_shape: tuple[int, ...], common_shape: tuple[int, ...], dim: int) -> int | None:
    """The dim of ``arg_shape`` that broadcasts onto ``common_shape``'s ``dim``, or None if broadcast."""
    arg_dim = dim - (len(common_shape) - len(arg_shape))
    if arg_dim < 0 or arg_shape[arg_dim] != common_shape[dim]:
        return None
    return arg_dim


def pointwise_rules(info: OpInfo, linear_in: Sequence[Sequence[int]] = ()) -> list[Row]:
    """Shard rows over the broadcast shape, plus one ``P`` row per group in ``linear_in``.

    ``linear_in`` lists groups of tensor-argument indices (in flattened order) the op is jointly
    linear in. A group naming an index the call lacks is skipped: ``mul.Tensor(x, 2.0)`` has one
    tensor, so its group ``(1,)`` does not apply while ``(0,)`` does; ``add.Tensor(x, 2.0)``'s only
    group ``(0, 1)`` does not apply, since a scalar added on every rank would be summed once per rank.
    """
    shapes = [meta.shape for meta in info.inputs]
    common = tuple(torch.broadcast_shapes(*shapes)) if shapes else ()
    n_out = len(info.outputs)
    rows: list[Row] = []
    for dim in range(len(common)):
        arg_codes = []
        for shape in shapes:
            arg_dim = broadcast_dim(shape, common, dim)
            arg_codes.append(R if arg_dim is None else arg_dim)
        rows.append([dim] * n_out + arg_codes)
    for group in linear_in:
        if all(0 <= k < len(shapes) for k in group):
            rows.append([P] * n_out + [P if k in group else R for k in range(len(shapes))])
    return rows


# ------------------------------------------------------------------------------------- nonlinear ops

ELEMENTWISE_OPS = (
    aten.add.Scalar,
    aten.sub.Scalar,
    aten.rsub.Scalar,
    aten.exp.default,
    aten.log.default,
    aten.sqrt.default,
    aten.rsqrt.default,
    aten.pow.Tensor_Scalar,
    aten.pow.Tensor_Tensor,
    aten.pow.Scalar,
    aten.tanh.default,
    aten.sigmoid.default,
    aten.relu.default,
    aten.abs.default,
    aten.reciprocal.default,
    aten.clamp.default,
    aten.clamp.Tensor,
    aten.where.self,
    aten.masked_fill.Scalar,
    aten.masked_fill.Tensor,
    aten.eq.Scalar,
    aten.eq.Tensor,
    aten.ne.Scalar,
    aten.ne.Tensor,
    aten.lt.Scalar,
    aten.lt.Tensor,
    aten.gt.Scalar,
    aten.gt.Tensor,
    aten.ge.Scalar,
    aten.ge.Tensor,
    aten.le.Scalar,
    aten.le.Tensor,
    aten.logical_not.default,
    aten.logical_and.default,
    aten.logical_or.default,
    aten.bitwise_not.default,
    aten.bitwise_and.Tensor,
    aten.bitwise_or.Tensor,
    aten.bitwise_xor.Tensor,
    aten.gelu.default,
    aten.gelu_backward.default,
    aten.silu.default,
    aten.silu_backward.default,
    aten.threshold_backward.default,
    aten.sigmoid_backward.default,
    aten.tanh_backward.default,
    aten.native_dropout_backward.default,
    aten.fill_.Scalar,
    aten.clone.default,
)
"""Ops sharded along any dim, never partial. ``fill_`` is here although DTensor lets ``P`` through it:
every rank would write the value, and the sum over ranks would be the value times the ranks. ``clone``
could keep ``P`` but DTensor reduces a partial input first (its pointwise rule for ``clone`` wins)."""


@register(*ELEMENTWISE_OPS, aten.bernoulli_.float)
def elementwise_rules(info: OpInfo) -> list[Row]:
    """Random ops too: each shard draws its own numbers, a partial input has no meaning for them."""
    return pointwise_rules(info)


@register(aten.native_dropout.default, even_only=True)
def dropout_rules(info: OpInfo) -> list[Row]:
    """Even shards only: on an empty shard (a dim of 6 over 4 ranks leaves the last one empty) the CPU
    kernel returns a float32 mask instead of bool, and gathering the mask then fails."""
    return pointwise_rules(info)


# ---------------------------------------------------------------------------------------- linear ops


@register(aten.add.Tensor, aten.sub.Tensor)
def additive_rules(info: OpInfo) -> list[Row]:
    """``a + alpha b``: partial sums add up when both operands are partial."""
    return pointwise_rules(info, linear_in=[(0, 1)])


@register(aten.mul.Tensor)
def mul_rules(info: OpInfo) -> list[Row]:
    """A product is linear in each factor while the other one is whole."""
    return pointwise_rules(info, linear_in=[(0,), (1,)])


@register(aten.div.Tensor, aten.mul.Scalar, aten.div.Scalar, aten.neg.default)
def linear_in_self_rules(info: OpInfo) -> list[Row]:
    """Scaling (by a number, or dividing by a whole tensor) and negation keep partial sums."""
    return pointwise_rules(info, linear_in=[(0,)])


@register(aten.copy_.default)
def copy_rules(info: OpInfo) -> list[Row]:
    """``self.copy_(src)``: the result is ``src`` in ``self``'s placement, so both are partial together."""
    return pointwise_rules(info, linear_in=[(0, 1)])


# ------------------------------------------------------------------------------------ copies, casts


@register(aten.detach.default, aten.alias.default, kind="view")
def alias_rules(info: OpInfo) -> list[Row]:
    """Aliases of the same storage: any placement, partial included, at no compute cost."""
    return pointwise_rules(info, linear_in=[(0,)])


@register(aten._to_copy.default)
def to_copy_rules(info: OpInfo) -> list[Row]:
    """A cast commutes with a sum unless it rounds to integers or collapses to bool."""
    target = info.kwargs.get("dtype")
    return pointwise_rules(info, linear_in=[(0,)] if cast_keeps_sums(info.inputs[0], target) else [])


def cast_keeps_sums(source: TensorMeta, target: torch.dtype | None) -> bool:
    """True when ``cast(a) + cast(b) == cast(a + b)`` up to rounding: not float -> int, not -> bool."""
    if target is None or target == source.dtype:
        return True
    if target == torch.bool:
        return False
    return not (source.dtype.is_floating_point and not target.is_floating_point)
