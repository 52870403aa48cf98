"""The cost model: collective orderings, node boundaries, impossible moves, DTensor's redistribution steps,
strategy counts, uneven memory, roofline compute, hardware files, meshes and the strategy cache."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from strategies.cost.comm import (
    INF,
    all_gather_s,
    all_reduce_s,
    all_to_all_s,
    local_numel,
    redistribute_matrix,
    redistribute_s,
    redistribute_steps,
    reduce_scatter_s,
)
from strategies.cost.hardware import PRESETS, HardwareError, get_hardware, load_hardware
from strategies.cost.mesh import MeshError, make_mesh
from strategies.ops.generate import clear_cache, op_strategies
from strategies.placement import P_AVG, P_MAX, P, R, from_dtensor, to_dtensor
from strategies.tensor_meta import TensorMeta as T

aten = torch.ops.aten
MiB = 2**20


# ------------------------------------------------------------------------------------------ collectives


@pytest.mark.parametrize("hardware", sorted(PRESETS))
@pytest.mark.parametrize("axis_size", [2, 4, 8])
@pytest.mark.parametrize("nbytes", [1024, MiB, 256 * MiB])
def test_one_all_reduce_beats_reduce_scatter_plus_all_gather(
    hardware: str, axis_size: int, nbytes: int
) -> None:
    mesh = make_mesh((axis_size,), hardware=hardware)
    two_step = reduce_scatter_s(mesh, 0, nbytes) + all_gather_s(mesh, 0, nbytes)
    assert all_reduce_s(mesh, 0, nbytes) < two_step


@pytest.mark.parametrize("nbytes", [MiB, 256 * MiB])
def test_reduce_scatter_is_cheaper_than_all_reduce(nbytes: int) -> None:
    mesh = make_mesh((8,), hardware="h100")
    assert reduce_scatter_s(mesh, 0, nbytes) < all_reduce_s(mesh, 0, nbytes)


@pytest.mark.parametrize("shape", [(8, 8), (16, 8), (2, 8)])
def test_an_axis_crossing_nodes_costs_more_than_one_inside_a_node(shape: tuple[int, int]) -> None:
    mesh = make_mesh(shape, hardware="h100")  # 8 GPUs a node: axis 1 stays inside, axis 0 spans nodes
    assert mesh.crosses_nodes(0) and not mesh.crosses_nodes(1)
    assert mesh.links[0] == PRESETS["h100"].inter_node and mesh.links[1] == PRESETS["h100"].intra_node
    if shape[0] == shape[1]:  # same group size: only the link differs
        for collective in (all_gather_s, reduce_scatter_s, all_reduce_s, all_to_all_s):
            assert collective(mesh, 0, 64 * MiB) > collective(mesh, 1, 64 * MiB)
    # a tensor gathered over the outer axis costs more than over the inner one, even with fewer peers
    tensor = (4096, 4096)
    assert redistribute_s(mesh, tensor, 2, (0, R), (R, R)) > redistribute_s(mesh, tensor, 2, (R, 0), (R, R))


def test_a_mesh_inside_one_node_uses_nvlink_on_every_axis() -> None:
    mesh = make_mesh((2, 4), hardware="h100")
    assert not any(mesh.crosses_nodes(a) for a in range(2))
    assert set(mesh.links) == {PRESETS["h100"].intra_node}


def test_collectives_on_an_axis_of_one_device_are_free() -> None:
    mesh = make_mesh((1, 4))
    assert all_gather_s(mesh, 0, MiB) == reduce_scatter_s(mesh, 0, MiB) == all_reduce_s(mesh, 0, MiB) == 0


# ----------------------------------------------------------------------------------------- transitions


@pytest.mark.parametrize(
    ("src", "dst"),
    [
        ((0,), (P,)),
        ((1,), (P_MAX,)),
        ((P,), (P_MAX,)),
        ((P_MAX,), (P,)),
        ((P_AVG,), (P_MAX,)),
        ((0, R), (P, R)),
    ],
)
def test_impossible_transitions_are_infinite(src: tuple[int, ...], dst: tuple[int, ...]) -> None:
    mesh = make_mesh((4,) * len(src))
    assert redistribute_s(mesh, (64, 64), 4, src, dst) == INF


@pytest.mark.parametrize("dst", [(0,), (1,), (P,), (P_MAX,)])
def test_replicate_to_shard_or_partial_is_free(dst: tuple[int, ...]) -> None:
    assert redistribute_s(make_mesh((4,)), (64, 64), 4, (R,), dst) == 0


def test_each_move_is_the_collective_dtensor_uses() -> None:
    mesh = make_mesh((4,))

    def collective(src: int, dst: int) -> str:
        (step,) = redistribute_steps(mesh, (64, 64), 4, (src,), (dst,))
        return step.collective

    assert collective(0, R) == "all_gather"
    assert collective(0, 1) == "all_to_all"
    assert collective(P, R) == "all_reduce"
    assert collective(P, 1) == "reduce_scatter"
    assert collective(R, 0) == "local"


def test_gathering_a_shard_moves_the_whole_tensor_through_the_ring() -> None:
    mesh = make_mesh((4,), hardware="h100")
    link = mesh.links[0]
    nbytes = 1024 * 1024 * 4
    expected = mesh.hardware.collective_launch_s + 3 * link.latency + 3 / 4 * nbytes / link.bandwidth
    assert math.isclose(redistribute_s(mesh, (1024, 1024), 4, (0,), (R,)), expected)


def _moves(
    mesh_shape: tuple[int, ...], src: tuple[int, ...], dst: tuple[int, ...]
) -> list[tuple[int, int, int]]:
    steps = redistribute_steps(make_mesh(mesh_shape), (16, 16, 16), 4, src, dst)
    return [(s.axis, s.src, s.dst) for s in steps]


def test_nested_sharding_is_undone_from_the_inside_like_dtensor() -> None:
    # (S(0), S(0)) -> (R, S(0)): the inner shard of dim 0 is nested inside the outer one; DTensor
    # gathers both axes, then slices dim 0 again on the inner axis.
    assert _moves((2, 2), (0, 0), (R, 0)) == [(1, 0, R), (0, 0, R), (1, R, 0)]
    steps = redistribute_steps(make_mesh((2, 2)), (16, 16), 4, (0, 0), (R, 0))
    assert [s.collective for s in steps] == ["all_gather", "all_gather", "local"]
    # (S(0), S(1)) -> (S(1), S(0)): inner axis to R, outer axis all-to-all, inner axis slices.
    assert _moves((2, 2), (0, 1), (1, 0)) == [(1, 1, R), (0, 0, 1), (1, R, 0)]
    # (S(0), R) -> (R, S(0)): the inner axis may only cut dim 0 once the outer one no longer does.
    assert _moves((2, 2), (0, R), (R, 0)) == [(0, 0, R), (1, R, 0)]


def _dtensor_moves(mesh_shape: tuple[int, ...], shape: tuple[int, ...], src: tuple, dst: tuple) -> list:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
    from torch.distributed.tensor._redistribute import _gen_transform_infos_non_cached

    mesh = DeviceMesh(
        "cpu", torch.arange(math.prod(mesh_shape)).reshape(mesh_shape), _init_backend=False, _rank=0
    )
    stride = tuple(math.prod(shape[i + 1 :]) for i in range(len(shape)))
    meta = TensorMeta(torch.Size(shape), stride, torch.float32)
    infos = _gen_transform_infos_non_cached(
        DTensorSpec(mesh, to_dtensor(src), tensor_meta=meta),
        DTensorSpec(mesh, to_dtensor(dst), tensor_meta=meta),
    )
    return [(i.mesh_dim, *from_dtensor(i.src_dst_placements)) for i in infos]


@pytest.mark.parametrize("mesh_shape", [(2, 2), (4, 2), (2, 2, 2), (2, 4, 2)])
def test_redistribution_steps_match_dtensors_planner(mesh_shape: tuple[int, ...]) -> None:
    rng = random.Random(sum(mesh_shape) * 31 + len(mesh_shape))
    codes = [R, P, 0, 1, 2]
    for _ in range(300):
        src = tuple(rng.choice(codes) for _ in mesh_shape)
        dst = tuple(rng.choice(codes) for _ in mesh_shape)
        assert _moves(mesh_shape, src, dst) == _dtensor_moves(mesh_shape, (16, 16, 16), src, dst), (src, dst)


def test_uneven_shards_move_their_largest_piece() -> None:
    mesh = make_mesh((4,))
    assert local_numel((10, 8), (0,), mesh.shape) == 3 * 8
    (step,) = redistribute_steps(mesh, (10, 8), 4, (0,), (R,))
    assert step.nbytes == 10 * 8 * 4  # the gathered tensor
    (step,) = redistribute_steps(mesh, (10, 8), 4, (0,), (1,))
    assert step.nbytes == 3 * 8 * 4  # the piece each device sends out


def test_a_redistribution_matrix_holds_each_pairs_cost() -> None:
    import numpy as np

    mesh = make_mesh((2, 4))
    src = np.array([[R, R], [0, R], [P, 1], [0, 0]], dtype=np.int16)
    dst = np.array([[R, R], [R, 0], [1, 0], [P, R]], dtype=np.int16)
    matrix = redistribute_matrix(mesh, (32, 32), 2, src, dst)
    assert matrix.shape == (4, 4)
    for i, s in enumerate(src.tolist()):
        for j, d in enumerate(dst.tolist()):
            assert matrix[i, j] == redistribute_s(mesh, (32, 32), 2, tuple(s), tuple(d))
    assert matrix[1, 3] == INF and matrix[0, 1] == 0


# -------------------------------------------------------------------------------------- strategy counts


def _dtensor_mm(mesh_shape: tuple[int, ...], a: tuple[int, int], b: tuple[int, int]) -> set:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Replicate
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
    from torch.distributed.tensor._op_schema import OpSchema, OpSpec, OpStrategy

    mesh = DeviceMesh(
        "cpu", torch.arange(math.prod(mesh_shape)).reshape(mesh_shape), _init_backend=False, _rank=0
    )

    def replicated(shape: tuple[int, int]) -> OpStrategy:
        meta = TensorMeta(torch.Size(shape), (shape[1], 1), torch.float32)
        return OpStrategy([OpSpec(DTensorSpec(mesh, (Replicate(),) * len(mesh_shape), tensor_meta=meta))])

    funcs = DTensor._op_dispatcher.sharding_propagator.op_strategy_funcs
    result = funcs[aten.mm.default](OpSchema(aten.mm.default, (replicated(a), replicated(b)), {}))
    return {
        (from_dtensor(s.output_spec.placements), tuple(from_dtensor(i.placements) for i in s.input_specs))
        for s in result.strategies
    }


def _ours(mesh_shape: tuple[int, ...], a: tuple[int, int], b: tuple[int, int]) -> set:
    s = op_strategies(aten.mm.default, (T(a), T(b)), {}, make_mesh(mesh_shape))
    return {
        (tuple(s.output_specs[i, 0].tolist()), tuple(tuple(x) for x in s.input_specs[i].tolist()))
        for i in range(len(s))
    }


@pytest.mark.parametrize(("mesh_shape", "count"), [((4,), 4), ((8,), 4), ((2, 2), 16), ((8, 8), 16)])
def test_mm_has_4_strategies_on_1d_and_16_on_2d_like_dtensor(mesh_shape: tuple[int, ...], count: int) -> None:
    a, b = (1024, 512), (512, 256)
    assert len(_ours(mesh_shape, a, b)) == count
    assert _ours(mesh_shape, a, b) == _dtensor_mm(mesh_shape, a, b)


def test_mm_on_a_3d_mesh_has_64_strategies_like_dtensor() -> None:
    a, b = (256, 256), (256, 256)
    assert len(_ours((2, 2, 2), a, b)) == 64
    assert _ours((2, 2, 2), a, b) == _dtensor_mm((2, 2, 2), a, b)


def test_small_dims_lose_the_strategies_dtensor_drops_too() -> None:
    a, b = (64, 32), (32, 16)  # n = 16 cannot be cut 64 ways on 8x8
    assert len(_ours((8, 8), a, b)) == 14
    assert _ours((8, 8), a, b) == _dtensor_mm((8, 8), a, b)


# -------------------------------------------------------------------------------------- memory, compute


def test_memory_of_an_uneven_shard_counts_the_largest_piece() -> None:
    s = op_strategies(aten.mm.default, (T((10, 8)), T((8, 6))), {}, make_mesh((2, 2)))
    by_output = {tuple(s.output_specs[i, 0].tolist()): int(s.memory_bytes[i]) for i in range(len(s))}
    assert by_output[(0, 0)] == 3 * 6 * 4  # 10 rows over 4 devices: pieces of 3, 3, 2, 2
    assert by_output[(0, 1)] == 5 * 3 * 4
    assert by_output[(R, R)] == 10 * 6 * 4
    assert by_output[(P, P)] == 10 * 6 * 4  # partial sums are whole-sized


def _mm_compute(hardware: str, out: tuple[int, ...], inputs: tuple[tuple[int, ...], ...]) -> float:
    n = 8192
    s = op_strategies(
        aten.mm.default,
        (T((n, n), torch.bfloat16), T((n, n), torch.bfloat16)),
        {},
        make_mesh((2,), hardware=hardware),
    )
    for i in range(len(s)):
        if (
            tuple(s.output_specs[i, 0].tolist()) == out
            and tuple(tuple(x) for x in s.input_specs[i].tolist()) == inputs
        ):
            return float(s.compute_s[i])
    raise AssertionError(f"no strategy {out} <- {inputs}")


def test_a_big_bf16_mm_on_h100_runs_at_cublas_rate_and_halves_when_sharded() -> None:
    hw = PRESETS["h100"]
    n = 8192
    whole = _mm_compute("h100", (R,), ((R,), (R,)))
    kernel_s = (whole - hw.launch_s) * hw.sustained_efficiency  # the kernel alone, not within a step
    # cuBLAS reaches 795 TFLOP/s at 8192^3 bf16 (pranjalssh/fast.cu README); the model, fitted to XLA's
    # sm_90 table and the MAMF table, within 3% of it
    assert math.isclose(2 * n**3 / kernel_s, 795e12, rel_tol=0.03)
    contracting = _mm_compute("h100", (P,), ((1,), (0,)))
    rows = _mm_compute("h100", (0,), ((0,), (R,)))
    cols = _mm_compute("h100", (1,), ((R,), (1,)))
    for sharded in (contracting, rows, cols):  # 32 and 16 waves of 128x128 tiles: no quantisation loss
        assert math.isclose(sharded / whole, 0.5, rel_tol=0.02)


def test_a_small_mm_costs_about_a_launch_and_is_not_sped_up_by_sharding() -> None:
    tensor = T((8, 8), torch.bfloat16)
    s = op_strategies(aten.mm.default, (tensor, tensor), {}, make_mesh((4,), hardware="h100"))
    launch = PRESETS["h100"].launch_s
    assert all(launch < c < 1.2 * launch for c in s.compute_s)


def test_a_slower_gpu_takes_longer_for_the_same_mm() -> None:
    assert (
        _mm_compute("a100", (R,), ((R,), (R,)))
        > _mm_compute("h100", (R,), ((R,), (R,)))
        > _mm_compute("b200", (R,), ((R,), (R,)))
    )


# -------------------------------------------------------------------------------------- hardware files


def test_a_json_file_overrides_figures_of_its_base(tmp_path: Path) -> None:
    path = tmp_path / "hw.json"
    path.write_text(json.dumps({"base": "h100", "peak_flops": {"bfloat16": 494.5e12}, "node_size": 4}))
    hw = load_hardware(path)
    assert (
        hw.peak_flops["bfloat16"] == 494.5e12
        and hw.peak_flops["float32"] == PRESETS["h100"].peak_flops["float32"]
    )
    assert hw.node_size == 4 and hw.memory_bandwidth == PRESETS["h100"].memory_bandwidth
    assert make_mesh((2, 4), hardware=str(path)).crosses_nodes(0)  # 8 devices no longer fit one node
    assert math.isclose(
        _mm_compute(str(path), (R,), ((R,), (R,))) - hw.launch_s,
        2 * (_mm_compute("h100", (R,), ((R,), (R,))) - hw.launch_s),
        rel_tol=1e-6,
    )


def test_a_yaml_file_overrides_links(tmp_path: Path) -> None:
    path = tmp_path / "hw.yaml"
    path.write_text("base: a100\ninter_node:\n  bandwidth: 12.5e9\nlaunch_s: 1e-5\n")
    hw = get_hardware(str(path))
    assert hw.inter_node.bandwidth == 12.5e9 and hw.inter_node.latency == PRESETS["a100"].inter_node.latency
    assert hw.launch_s == 1e-5 and hw.peak_flops == PRESETS["a100"].peak_flops
    slow, base = make_mesh((2, 8), hardware=hw), make_mesh((2, 8), hardware="a100")
    assert all_gather_s(slow, 0, 64 * MiB) > 1.9 * all_gather_s(base, 0, 64 * MiB)
    assert all_gather_s(slow, 1, 64 * MiB) == all_gather_s(base, 1, 64 * MiB)


@pytest.mark.parametrize(
    ("name", "text", "field"),
    [
        ("unknown.json", '{"flops": 1}', "hardware.flops"),
        ("negative.json", '{"inter_node": {"bandwidth": -1}}', "hardware.inter_node.bandwidth"),
        ("extra.json", '{"intra_node": {"speed": 1}}', "hardware.intra_node"),
        ("word.yaml", "memory_bandwidth: fast\n", "hardware.memory_bandwidth"),
        ("dtype.yaml", "peak_flops: {bfloat16: 0}\n", "hardware.peak_flops.bfloat16"),
        ("base.yaml", "base: tpu\n", "hardware.base"),
        ("list.yaml", "- 1\n- 2\n", "hardware:"),
        ("broken.json", "{", "not valid JSON"),
        ("broken.yaml", "a: [1\n", "not valid YAML"),
    ],
)
def test_a_bad_hardware_file_names_the_field(tmp_path: Path, name: str, text: str, field: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(HardwareError, match=field.replace(".", r"\.")):
        get_hardware(str(path))


def test_unknown_presets_and_missing_files_are_hardware_errors(tmp_path: Path) -> None:
    with pytest.raises(HardwareError, match="unknown preset 'tpu'"):
        get_hardware("tpu")
    with pytest.raises(HardwareError, match="cannot read"):
        get_hardware(str(tmp_path / "missing.yaml"))


@pytest.mark.parametrize(
    ("shape", "names", "field"),
    [
        ("2x0", None, "mesh"),
        ("2y2", None, "mesh"),
        ("", None, "mesh"),
        ("2x2", "dp", "axis_names"),
        ("2x2", "a,a", "axis_names"),
    ],
)
def test_a_bad_mesh_names_the_field(shape: str, names: str | None, field: str) -> None:
    with pytest.raises(MeshError, match=f"^{field}:"):
        make_mesh(shape, names)


def test_a_mesh_from_text_and_its_default_axis_names() -> None:
    mesh = make_mesh("2x4x8")
    assert mesh.shape == (2, 4, 8) and mesh.axis_names == ("dp", "cp", "tp") and mesh.size == 64


# ----------------------------------------------------------------------------------------------- cache


def test_the_second_call_returns_the_cached_object() -> None:
    clear_cache()
    args = (T((128, 64)), T((64, 32)))
    first = op_strategies(aten.mm.default, args, {}, make_mesh((2, 2)))
    assert op_strategies(aten.mm.default, (T((128, 64)), T((64, 32))), {}, make_mesh((2, 2))) is first
    assert op_strategies(aten.mm.default, args, {}, make_mesh((2, 2), hardware="a100")) is not first
    assert (
        op_strategies(aten.mm.default, (T((128, 64), torch.bfloat16), T((64, 32))), {}, make_mesh((2, 2)))
        is not first
    )
    clear_cache()
    assert op_strategies(aten.mm.default, args, {}, make_mesh((2, 2))) is not first


@pytest.mark.parametrize("axes", [1, 3, 7, 8, 9])
def test_distinct_spec_rows_are_found_for_any_number_of_mesh_axes(axes: int) -> None:
    from strategies.cost.comm import _unique_rows

    rows = np.random.default_rng(axes).choice([-100, -6, -2, -1, 0, 1, 2, 3], size=(400, axes))
    unique, index = _unique_rows(rows.astype(np.int16))
    assert (unique[index] == rows).all()
    assert len(unique) == len(np.unique(rows, axis=0))
