"""``autoshard::einsum(str equation, Tensor a, Tensor b) -> Tensor``: a two-operand contraction that keeps
every named dim visible, and its strategies.

Why an op of our own: a captured ``F.linear`` on ``[B, S, K]`` is ``view([B*S, K]) -> mm -> view``, and a
shard of ``S`` cannot pass through the flattening view. :mod:`strategies.graph.passes` rewrites those chains
into this op (``"bsk,kn->bsn"``), so the sequence dim stays a dim of its own and can be sharded (sequence
and context parallelism). ``aten.einsum`` would not do: make_fx decomposes it back into ``bmm`` and views.

The op is a plain ``torch.einsum`` restricted to equations whose gradients are einsums of the same kind:
two operands, lowercase letters, no letter twice in one operand, every output letter in an operand, every
operand letter in the other operand or the output (no one-sided sums), equal sizes for a shared letter.
Its autograd formula is written with this op, so differentiating a graph that already holds it yields it
again:

    grad_a = einsum("O,B->A", grad, b)        grad_b = einsum("A,O->B", a, grad)

for ``equation = "A,B->O"``. Strategies come from :func:`strategies.ops._einsum.einsum_rules` (one rule per
batch / contracting / free letter); FLOPs are ``2 * prod(size of every letter)`` on local shapes.
"""

from __future__ import annotations

import math

import torch

from strategies.ops._einsum import einsum_rules
from strategies.ops.registry import OpInfo, Row, register


def parse_equation(equation: str) -> tuple[str, str, str]:
    """``"bsk,kn->bsn"`` -> ``("bsk", "kn", "bsn")``, or a ``ValueError`` naming what is not supported."""
    text = equation.replace(" ", "")
    if text.count("->") != 1 or text.split("->")[0].count(",") != 1:
        raise ValueError(f"einsum equation {equation!r}: expected the form 'A,B->O' with two operands")
    operands, out = text.split("->")
    a, b = operands.split(",")
    for name, term in (("first operand", a), ("second operand", b), ("output", out)):
        if not all("a" <= c <= "z" for c in term):
            raise ValueError(f"einsum equation {equation!r}: {name} {term!r} must be lowercase letters")
        if len(set(term)) != len(term):
            raise ValueError(f"einsum equation {equation!r}: {name} {term!r} repeats a letter")
    if set(out) - set(a) - set(b):
        raise ValueError(
            f"einsum equation {equation!r}: output letters {sorted(set(out) - set(a + b))} absent"
        )
    one_sided = (set(a) - set(b) - set(out)) | (set(b) - set(a) - set(out))
    if one_sided:
        raise ValueError(
            f"einsum equation {equation!r}: letters {sorted(one_sided)} are summed in one operand only"
        )
    return a, b, out


def letter_sizes(equation: str, a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> dict[str, int]:
    """The size of every letter, checked against both operands' ranks and each other."""
    a, b, _ = parse_equation(equation)
    sizes: dict[str, int] = {}
    for term, shape, name in ((a, a_shape, "a"), (b, b_shape, "b")):
        if len(term) != len(shape):
            raise ValueError(
                f"einsum {equation!r}: {name} has shape {list(shape)}, expected {len(term)} dims"
            )
        for letter, size in zip(term, shape, strict=True):
            if sizes.setdefault(letter, int(size)) != int(size):
                raise ValueError(
                    f"einsum {equation!r}: letter {letter!r} is {sizes[letter]} in one operand and {size} "
                    "in the other"
                )
    return sizes


def output_shape(equation: str, a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> tuple[int, ...]:
    sizes = letter_sizes(equation, a_shape, b_shape)
    return tuple(sizes[letter] for letter in parse_equation(equation)[2])


def _check_operands(equation: str, a: torch.Tensor, b: torch.Tensor) -> tuple[int, ...]:
    if a.dtype != b.dtype:
        raise ValueError(f"einsum {equation!r}: operands have dtypes {a.dtype} and {b.dtype}")
    return output_shape(equation, tuple(a.shape), tuple(b.shape))


@torch.library.custom_op(
    "autoshard::einsum", mutates_args=(), schema="(str equation, Tensor a, Tensor b) -> Tensor"
)
def einsum(equation: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``torch.einsum(equation, a, b)``, contiguous (graph passes view its result)."""
    _check_operands(equation, a, b)
    return torch.einsum(equation, a, b).contiguous()


@einsum.register_fake
def _einsum_fake(equation: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.new_empty(_check_operands(equation, a, b))


def _setup_context(ctx: torch.autograd.function.FunctionCtx, inputs: tuple, output: torch.Tensor) -> None:
    equation, a, b = inputs
    ctx.equation = equation
    ctx.save_for_backward(a, b)


def _backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> tuple:
    """``grad_a = einsum("O,B->A", grad, b)``, ``grad_b = einsum("A,O->B", a, grad)``."""
    a, b = ctx.saved_tensors
    a_term, b_term, out = parse_equation(ctx.equation)
    grad_a = grad_b = None
    if ctx.needs_input_grad[1]:
        grad_a = torch.ops.autoshard.einsum(f"{out},{b_term}->{a_term}", grad, b)
    if ctx.needs_input_grad[2]:
        grad_b = torch.ops.autoshard.einsum(f"{a_term},{out}->{b_term}", a, grad)
    return None, grad_a, grad_b


einsum.register_autograd(_backward, setup_context=_setup_context)

EINSUM = torch.ops.autoshard.einsum.default
"""The op overload graph passes insert and strategies are registered for."""


def einsum_flops(info: OpInfo, in_shapes: list[tuple[int, ...]], out_shapes: list) -> float:
    """``2 * prod(size of every letter)``: one multiply and one add per point of the index space."""
    sizes = letter_sizes(info.arg(0, "equation"), in_shapes[0], in_shapes[1])
    return 2.0 * math.prod(sizes.values())


@register(EINSUM, flops=einsum_flops)
def autoshard_einsum_rules(info: OpInfo) -> list[Row]:
    """One rule per letter: batch letters shard everywhere, contracting letters give ``P``, free letters
    shard their operand and the output."""
    equation = info.arg(0, "equation")
    parse_equation(equation)
    return einsum_rules(equation)
