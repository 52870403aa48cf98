"""Which link a mesh axis's collectives run over (`strategies/cost/mesh.py`), and NCCL's algorithms."""

from __future__ import annotations

import pytest

from strategies.cost.comm import all_gather_s, all_reduce_s
from strategies.cost.hardware import PRESETS
from strategies.cost.mesh import make_mesh

H100 = PRESETS["h100"]
MiB = 2**20


def test_an_fsdp_axis_over_16_nodes_moves_at_the_nodes_nics_combined_rate() -> None:
    (link,) = make_mesh((128,), hardware="h100").links  # 8 GPUs in each of 16 nodes, each with its NIC
    per_byte = max(127 / 128 / H100.intra_node.bandwidth, 15 / 16 / (8 * H100.inter_node.bandwidth))
    assert link.bandwidth == pytest.approx(127 / 128 / per_byte)
    assert link.bandwidth > 7 * H100.inter_node.bandwidth  # not one NIC's rate
    assert H100.intra_node.latency < link.latency < H100.inter_node.latency  # 16 of 128 hops cross nodes


def test_an_axis_with_one_gpu_per_node_runs_over_one_nic() -> None:
    mesh = make_mesh((16, 8), hardware="h100")
    assert mesh.links == (H100.inter_node, H100.intra_node)


def test_all_reduce_is_a_ring_inside_a_node_and_may_be_a_tree_across_nodes() -> None:
    inside = make_mesh((8,), hardware="h100")
    n, a, c, b = 8, H100.intra_node.latency, H100.collective_launch_s, H100.intra_node.bandwidth
    ring = c + 2 * (n - 1) * a + 2 * (n - 1) / n * MiB / b
    assert all_reduce_s(inside, 0, MiB) == pytest.approx(ring, rel=1e-12)
    across = make_mesh((64, 8), hardware="h100")  # axis 0: 64 nodes, one GPU each
    n, a, b = 64, H100.inter_node.latency, H100.inter_node.bandwidth
    tree = c + 2 * 6 * a + 2 * 1024 / b
    assert all_reduce_s(across, 0, 1024) == pytest.approx(tree, rel=1e-12)  # small: the tree's log latency
    assert all_gather_s(across, 0, 1024) > all_reduce_s(across, 0, 1024)  # a ring pass has 63 hops
