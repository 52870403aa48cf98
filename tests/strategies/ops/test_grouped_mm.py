"""``autoshard::grouped_mm``, the experts' product with explicit group bounds, and its expert-parallel rows.

On 4 gloo ranks (meshes (4,) and (2, 2)) every strategy of the three grouped forms runs in DTensor as
predicted, in float32, with an empty group and rows no group covers; without ranks: the op equals
``aten._grouped_mm`` where the aten kernel defines its output, the expert-parallel row is offered by our op
and never by the aten one, and a rank's FLOPs are its experts' share.
"""

from __future__ import annotations

import pytest
import torch

from strategies.cost.mesh import make_mesh
from strategies.ops.generate import op_strategies
from strategies.ops.grouped_mm_ops import GROUPED_MM, grouped_mm, grouped_mm_flops
from strategies.ops.registry import OpInfo
from strategies.placement import P, R
from strategies.tensor_meta import TensorMeta as T
from tests.strategies.ops.conformance import MESHES, Case, Fixed, gloo  # noqa: F401

aten = torch.ops.aten
OP = "autoshard.grouped_mm.default"
I32 = torch.int32


def _bounds(ends: tuple[int, ...]) -> tuple[Fixed, Fixed]:
    """``ends`` and the starts they imply (each group starts where the one before ends), as int32."""
    return Fixed(ends, I32), Fixed((0, *ends[:-1]), I32)


CASES = {
    # tokens sorted by expert x stacked expert weights; group 1 empty, rows 28..31 in no group
    "2dx3d": Case(OP, (T((32, 16)), T((4, 16, 24)), *_bounds((8, 8, 20, 28)))),
    # per-group blocks of the output's columns
    "3dx2d": Case(OP, (T((4, 12, 16)), T((16, 48)), *_bounds((12, 12, 30, 48)))),
    # the weight gradient: groups of the contracted tokens
    "2dx2d": Case(OP, (T((16, 40)), T((40, 24)), *_bounds((10, 10, 25, 40)))),
}


@pytest.mark.parametrize("mesh_shape", MESHES, ids=lambda m: "x".join(map(str, m)))
@pytest.mark.parametrize("form", list(CASES))
def test_every_grouped_strategy_runs_as_predicted(gloo, form: str, mesh_shape: tuple[int, ...]) -> None:  # noqa: F811
    failures = gloo.check(CASES[form], mesh_shape)
    assert not failures, "\n".join(failures)


def test_the_op_is_aten_grouped_mm_with_its_starts_made_explicit() -> None:
    torch.manual_seed(0)
    ends = torch.tensor([8, 8, 20, 32], dtype=I32)
    starts = torch.nn.functional.pad(ends, (1, -1))
    forms = [
        (torch.randn(32, 16), torch.randn(4, 16, 24)),
        (torch.randn(4, 12, 16), torch.randn(16, 32)),
        (torch.randn(16, 32), torch.randn(32, 24)),
    ]
    for a, b in forms:
        torch.testing.assert_close(grouped_mm(a, b, ends, starts), torch._grouped_mm(a, b, offs=ends))


def test_what_no_group_covers_is_zero_and_bounds_must_fit() -> None:
    a, b = torch.ones(6, 4), torch.ones(2, 4, 8)
    out = grouped_mm(a, b, torch.tensor([2, 4], dtype=I32), torch.tensor([1, 2], dtype=I32))
    assert out[[0, 4, 5]].abs().sum() == 0 and (out[1:4] == 4).all()
    with pytest.raises(ValueError, match=r"ends \[3\], starts \[3\]: expected \[2\]"):
        grouped_mm(a, b, torch.tensor([2, 4, 6], dtype=I32), torch.tensor([0, 2, 4], dtype=I32))


def _rows(op: object, args: tuple, output: T) -> set[tuple[tuple[int, ...], ...]]:
    """Single-axis strategies as ((output), (inputs...)) codes."""
    strategies = op_strategies(op, args, {}, make_mesh((4,)), outputs=(output,))
    return {
        (tuple(strategies.output_specs[i, :, 0]), tuple(strategies.input_specs[i, :, 0]))
        for i in range(len(strategies))
    }


def test_only_explicit_bounds_let_the_experts_be_cut() -> None:
    tokens, experts, ends = T((32, 16)), T((4, 16, 24)), T((4,), I32)
    ours = _rows(GROUPED_MM, (tokens, experts, ends, ends), T((32, 24)))
    assert (((P,), (R, 0, 0, 0))) in ours  # expert parallel: tokens whole, experts cut, result partial
    assert all(inputs[0] != 0 for _, inputs in ours)  # the sorted tokens are never cut by rows
    theirs = _rows(aten._grouped_mm.default, (tokens, experts, ends), T((32, 24)))
    assert all(inputs[1] != 0 for _, inputs in theirs)  # global offsets: experts stay whole
    assert {(out, inputs[:3]) for out, inputs in theirs} < {(out, inputs[:3]) for out, inputs in ours}
    weight_grad = _rows(GROUPED_MM, (T((16, 32)), T((32, 24)), ends, ends), T((4, 16, 24)))
    assert (((0,), (R, R, 0, 0))) in weight_grad  # each rank its experts' gradients, no reduction


def test_a_rank_computes_its_experts_share_of_the_flops() -> None:
    args = (T((32, 16)), T((4, 16, 24)), T((4,), I32), T((4,), I32))
    info = OpInfo(GROUPED_MM, args, {}, args, (T((32, 24)),))
    whole = grouped_mm_flops(info, [(32, 16), (4, 16, 24), (4,), (4,)], [(32, 24)])
    assert whole == 2 * 32 * 16 * 24
    assert grouped_mm_flops(info, [(32, 16), (1, 16, 24), (1,), (1,)], [(32, 24)]) == whole / 4
    grad = (T((16, 32)), T((32, 24)), T((4,), I32), T((4,), I32))
    grad_info = OpInfo(GROUPED_MM, grad, {}, grad, (T((4, 16, 24)),))
    assert grouped_mm_flops(grad_info, [(16, 32), (32, 24), (2,), (2,)], [(2, 16, 24)]) == whole / 2
