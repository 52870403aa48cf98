"""The GPU presets: the H200 is an H100 with more and faster memory."""

from __future__ import annotations

import math

import pytest
import torch

from strategies.cost.hardware import PRESETS, HardwareError, get_hardware
from strategies.cost.mesh import make_mesh
from strategies.ops.generate import op_strategies
from strategies.tensor_meta import TensorMeta

aten = torch.ops.aten


def _replicated_compute_s(hardware: str, op: object, *shapes: tuple[int, ...]) -> float:
    args = tuple(TensorMeta(s, torch.bfloat16) for s in shapes)
    return float(op_strategies(op, args, {}, make_mesh((1,), hardware=hardware)).compute_s[0])


def test_h200_has_the_h100s_compute_and_141_gb_at_4_8_tb_per_s() -> None:
    h100, h200 = PRESETS["h100"], get_hardware("h200")
    assert h200.name == "h200" and h200.peak_flops == h100.peak_flops
    assert h200.memory_bytes == 141 * 10**9 and h200.memory_bandwidth == 4.8e12
    assert (h200.intra_node, h200.inter_node, h200.node_size) == (h100.intra_node, h100.inter_node, 8)
    assert h100.memory_bytes == 80 * 2**30  # the other presets keep their GiB capacities


def test_h200_runs_a_big_mm_as_fast_as_h100_and_a_big_add_faster() -> None:
    n = 8192
    assert math.isclose(
        _replicated_compute_s("h200", aten.mm.default, (n, n), (n, n)),
        _replicated_compute_s("h100", aten.mm.default, (n, n), (n, n)),
    )
    add_h100 = _replicated_compute_s("h100", aten.add.Tensor, (n, n), (n, n)) - PRESETS["h100"].launch_s
    add_h200 = _replicated_compute_s("h200", aten.add.Tensor, (n, n), (n, n)) - PRESETS["h200"].launch_s
    assert math.isclose(add_h100 / add_h200, 4.8 / 3.35, rel_tol=1e-6)


def test_unknown_preset_lists_h200() -> None:
    with pytest.raises(HardwareError, match="'h200'"):
        get_hardware("h300")
