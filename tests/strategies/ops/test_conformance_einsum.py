"""``autoshard::einsum`` through :mod:`strategies.ops.dtensor_bridge`: every strategy runs in DTensor on 4
gloo ranks as predicted (meshes (4,) and (2, 2)), for the equations :mod:`strategies.graph.passes` writes."""

from __future__ import annotations

import pytest
import torch

from strategies.ops import einsum_ops  # noqa: F401  (defines the op before cases resolve it)
from strategies.tensor_meta import TensorMeta as T
from tests.strategies.ops.conformance import MESHES, Case, gloo  # noqa: F401

EINSUM = "autoshard.einsum.default"
B, S, K, N = 4, 8, 8, 12

CASES = [
    Case(EINSUM, ("bsk,kn->bsn", T((B, S, K)), T((K, N)))),  # forward
    Case(EINSUM, ("bsn,nk->bsk", T((B, S, N)), T((N, K)))),  # grad input
    Case(EINSUM, ("bsk,bsn->kn", T((B, S, K)), T((B, S, N)))),  # grad weight: contracts batch and sequence
]


@pytest.mark.parametrize("mesh_shape", MESHES, ids=lambda m: "x".join(map(str, m)))
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.args[0])
def test_every_einsum_strategy_runs_as_predicted(gloo, case: Case, mesh_shape: tuple[int, ...]) -> None:  # noqa: F811
    failures = gloo.check(case, mesh_shape)
    assert not failures, "\n".join(failures)


def test_four_dim_projection_and_uneven_sequence_conform(gloo) -> None:  # noqa: F811
    """``[B, S, H, K]`` inputs (``"bshk,kn->bshn"``) and a sequence of 6 cut 4 ways (uneven shards)."""
    assert not gloo.check(Case(EINSUM, ("bshk,kn->bshn", T((2, 4, 4, 8)), T((8, 4)))), (2, 2))
    assert not gloo.check(Case(EINSUM, ("bsk,bsn->kn", T((2, 6, 8)), T((2, 6, 4)))), (4,))


def test_bf16_einsum_conforms(gloo) -> None:  # noqa: F811
    case = Case(
        EINSUM,
        ("bsk,kn->bsn", T((4, 4, 8), torch.bfloat16), T((8, 8), torch.bfloat16)),
        atol=0.1,
        rtol=0.05,
    )
    assert not gloo.check(case, (2, 2))
