from __future__ import annotations

import pytest

from service.search.candidates import make_candidates, mesh_shapes, parse_axis_limits


def test_every_ordered_factorisation_into_one_to_three_axes() -> None:
    assert mesh_shapes(8) == [(8,), (2, 4), (4, 2), (2, 2, 2)]
    assert mesh_shapes(8, max_dims=2) == [(8,), (2, 4), (4, 2)]
    assert mesh_shapes(7) == [(7,)]
    assert mesh_shapes(1) == [(1,)]


def test_64_devices_give_16_meshes() -> None:
    shapes = mesh_shapes(64)
    assert len([s for s in shapes if len(s) == 1]) == 1
    assert len([s for s in shapes if len(s) == 2]) == 5  # 2x32 4x16 8x8 16x4 32x2
    assert len([s for s in shapes if len(s) == 3]) == 10  # compositions of 2^6 into three parts
    assert all(min(s) >= 2 and len(set(shapes)) == len(shapes) for s in shapes)


def test_candidates_are_meshes_times_batches_with_innermost_tp() -> None:
    candidates = make_candidates(8, [16, 32], seq=128)
    assert len(candidates) == 10  # 4 meshes without a pipeline and pp,dp,tp 2x2x2, at 2 batches
    assert [c.id for c in candidates][:3] == ["c00", "c01", "c02"]
    by_mesh = {(c.mesh, c.batch): c.axis_names for c in candidates if not c.pipelined}
    assert {(c.mesh, c.axis_names) for c in candidates if c.pipelined} == {((2, 2, 2), ("pp", "dp", "tp"))}
    assert by_mesh[((8,), 16)] == ("dp",)
    assert by_mesh[((2, 4), 32)] == ("dp", "tp")
    assert by_mesh[((2, 2, 2), 16)] == ("dp", "cp", "tp")


def test_bad_counts_are_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match="batch_sizes"):
        make_candidates(8, [], seq=None)
    with pytest.raises(ValueError, match="max_mesh_dims"):
        mesh_shapes(8, max_dims=5)


def test_four_axes_are_a_pipeline_and_only_with_batches_its_stages_divide() -> None:
    candidates = make_candidates(32, [2, 4], seq=None, max_dims=4)
    four = [c for c in candidates if len(c.mesh) == 4]
    assert {c.mesh for c in four} == {(4, 2, 2, 2), (2, 4, 2, 2), (2, 2, 4, 2), (2, 2, 2, 4)}
    assert all(c.axis_names == ("pp", "dp", "cp", "tp") and c.batch % c.mesh[0] == 0 for c in four)
    assert ((4, 2, 2, 2), 2) not in {(c.mesh, c.batch) for c in four}  # 2 sequences cannot fill 4 stages
    assert len(four) == 7
    # beside every 3-D mesh, a pipeline without context parallelism (Llama 3's pp x dp x tp), listed last
    three = [c for c in candidates if len(c.mesh) == 3]
    without_cp = [c for c in three if c.pipelined]
    assert all(c.axis_names == ("pp", "dp", "tp") and c.batch % c.mesh[0] == 0 for c in without_cp)
    # (8 stages fill no batch of 2 or 4)
    assert {c.mesh for c in without_cp} == {c.mesh for c in three if not c.pipelined and c.mesh[0] <= 4}
    assert candidates[-len(without_cp) :] == without_cp
    assert ((4, 2, 4), 2) not in {(c.mesh, c.batch) for c in without_cp} and len(without_cp) == 8
    assert all(len(c.mesh) < 4 and not c.pipelined for c in make_candidates(32, [4], seq=None, max_dims=3))


def test_a_pipeline_has_no_more_stages_than_the_model_has_layers() -> None:
    every = make_candidates(64, [64], seq=None, max_dims=4)
    kept = make_candidates(64, [64], seq=None, max_dims=4, max_stages=4)
    pipelines = {c.mesh for c in kept if c.pipelined}
    assert pipelines == {c.mesh for c in every if c.pipelined and c.mesh[0] <= 4}
    assert (4, 4, 2, 2) in pipelines and (8, 2, 2, 2) not in pipelines
    assert {c.mesh for c in kept if not c.pipelined} == {c.mesh for c in every if not c.pipelined}
    # with a pp limit of its own, the smaller of the two holds
    assert {
        c.mesh[0] for c in make_candidates(64, [64], None, 4, {"pp": 2}, max_stages=4) if c.pipelined
    } == {2}


def test_axis_limits_leave_out_the_meshes_with_a_larger_axis_of_that_role() -> None:
    every = make_candidates(64, [64], seq=None, max_dims=3)
    kept = make_candidates(64, [64], seq=None, max_dims=3, axis_limits=parse_axis_limits("tp=8"))
    assert {c.mesh for c in kept} == {
        c.mesh for c in every if dict(zip(c.axis_names, c.mesh, strict=True)).get("tp", 1) <= 8
    }
    assert (64,) in {c.mesh for c in kept} and (2, 32) not in {c.mesh for c in kept}
    assert (4, 2, 8) in {c.mesh for c in kept} and (2, 2, 16) not in {c.mesh for c in kept}
    with pytest.raises(ValueError, match="'xp' is not an axis"):
        parse_axis_limits("xp=8")
    with pytest.raises(ValueError, match="write NAME=SIZE"):
        parse_axis_limits("tp8")
    with pytest.raises(ValueError, match="no mesh of 64 devices"):
        make_candidates(64, [64], seq=None, max_dims=1, axis_limits={"dp": 8})
