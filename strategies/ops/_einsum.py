"""Einsum-style single-axis rules, the shared generator of the matrix ops.

For one mesh axis and an equation such as ``"mk,kn->mn"``:

- a batch dim (in every input and the output): shard it everywhere;
- a contracting dim (in the inputs, not the output): shard it on both inputs, the output is ``P``;
- an lhs-only or rhs-only free dim: shard it on that input and the output, the other input ``R``.

``bias`` adds the rows of an added tensor (``addmm``'s ``self``) right after the output: it follows
the output's placement where it has the dim (broadcast dims and size-1 dims stay ``R``).
"""

from __future__ import annotations

from strategies.ops.registry import Row
from strategies.placement import NONE, P, R


def einsum_rules(equation: str, bias_shape: tuple[int, ...] | None = None) -> list[Row]:
    inputs_text, output = equation.replace(" ", "").split("->")
    inputs = inputs_text.split(",")
    letters = sorted(set("".join(inputs)))
    rows: list[list[int]] = []
    for letter in letters:
        in_output = letter in output
        holders = [letter in spec for spec in inputs]
        if in_output and all(holders):  # batch dim
            rows.append([output.index(letter), *(spec.index(letter) for spec in inputs)])
        elif not in_output and all(holders):  # contracting dim
            rows.append([P, *(spec.index(letter) for spec in inputs)])
        elif in_output and sum(holders) == 1:  # free dim of one input
            rows.append(
                [
                    output.index(letter),
                    *(spec.index(letter) if has else R for spec, has in zip(inputs, holders, strict=False)),
                ]
            )
    if bias_shape is None:
        return rows
    return [[row[0], _bias_code(row[0], len(output), bias_shape), *row[1:]] for row in rows]


def _bias_code(output_code: int, output_ndim: int, bias_shape: tuple[int, ...]) -> int:
    """The placement of a tensor broadcast against the output, given the output's placement."""
    if output_code < 0:
        return output_code if output_code != NONE else R
    bias_dim = output_code - (output_ndim - len(bias_shape))
    if bias_dim < 0 or bias_shape[bias_dim] == 1:
        return R
    return bias_dim
