"""Matrix ops: every strategy runs in DTensor on 4 gloo ranks as predicted (meshes (4,) and (2, 2))."""

from __future__ import annotations

import pytest
import torch

from strategies.tensor_meta import TensorMeta as T
from tests.strategies.ops.conformance import MESHES, Case, gloo  # noqa: F401

CASES = [
    Case("aten.mm.default", (T((8, 12)), T((12, 16)))),
    Case("aten.addmm.default", (T((16,)), T((8, 12)), T((12, 16)))),
    Case("aten.addmm.default", (T((8, 16)), T((8, 12)), T((12, 16)))),
    Case("aten.bmm.default", (T((4, 8, 12)), T((4, 12, 16)))),
    Case("aten.baddbmm.default", (T((4, 8, 16)), T((4, 8, 12)), T((4, 12, 16)))),
    Case("aten.dot.default", (T((16,)), T((16,)))),
    Case("aten.t.default", (T((8, 12)),)),
    Case("aten.mm.default", (T((6, 4)), T((4, 10)))),  # uneven shards of 6 and 10 over 4
]


@pytest.mark.parametrize("mesh_shape", MESHES, ids=lambda m: "x".join(map(str, m)))
@pytest.mark.parametrize("case", CASES, ids=str)
def test_every_strategy_runs_as_predicted(gloo, case: Case, mesh_shape: tuple[int, ...]) -> None:  # noqa: F811
    failures = gloo.check(case, mesh_shape)
    assert not failures, "\n".join(failures)


def test_bf16_matmul_conforms(gloo) -> None:  # noqa: F811
    case = Case(
        "aten.mm.default", (T((8, 8), torch.bfloat16), T((8, 8), torch.bfloat16)), atol=0.1, rtol=0.05
    )
    assert not gloo.check(case, (2, 2))
