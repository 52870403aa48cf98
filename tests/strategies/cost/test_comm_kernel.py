"""The numba redistribution kernel prices every pair of specs exactly as the step-by-step reference
(`redistribute_s`) does: same seconds to the float, infinite for the same pairs, on 1-, 2- and 3-D meshes
with axes of one device, uneven tensors, partial placements and unread inputs."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from strategies.cost.comm import (
    all_reduce_s,
    all_to_all_s,
    pair_costs,
    redistribute_matrix,
    redistribute_parts,
    redistribute_s,
)
from strategies.cost.comm_kernel import axis_terms, expand_into
from strategies.cost.mesh import make_mesh
from strategies.placement import NONE, P_AVG, P_MASK, P_MAX, P_MIN, P, R

MESHES = ["4", "1", "2x4", "1x8", "16x8", "4x4x4", "2x1x4", "8x2x4"]
"""1-, 2- and 3-D, axes of one device, axes crossing nodes (h100: 8 devices a node)."""

SHAPES = [(16, 12, 6), (7, 5, 3), (9,), (), (5, 3, 1, 11)]
"""Even and uneven dims, a scalar, a dim of size 1."""


def _codes(ndim: int) -> list[int]:
    return [R, P, P_AVG, P_MAX, P_MIN, P_MASK, NONE, *range(ndim)]


def _reference(mesh_text: str, shape: tuple[int, ...], src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    mesh = make_mesh(mesh_text)
    return np.array(
        [
            redistribute_s(mesh, shape, 2, tuple(map(int, a)), tuple(map(int, b)))
            for a, b in zip(src, dst, strict=True)
        ]
    )


def _assert_same_seconds(kernel: np.ndarray, reference: np.ndarray) -> None:
    np.testing.assert_array_equal(np.isinf(kernel), np.isinf(reference))
    finite = np.isfinite(reference)
    np.testing.assert_allclose(kernel[finite], reference[finite], rtol=1e-12, atol=0)


def _random_pairs(mesh_text: str, shape: tuple[int, ...], count: int, seed: int) -> tuple[np.ndarray, ...]:
    """``count`` random spec pairs, then every spec paired with itself."""
    ndim = len(make_mesh(mesh_text).shape)
    specs = np.array(list(itertools.product(_codes(len(shape)), repeat=ndim)), dtype=np.int64)
    index = np.random.default_rng(seed).integers(0, len(specs), (count, 2))
    src = np.concatenate([specs[index[:, 0]], specs])
    dst = np.concatenate([specs[index[:, 1]], specs])
    return src, dst


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("mesh_text", MESHES)
def test_the_kernel_prices_each_pair_as_the_step_by_step_reference(
    mesh_text: str, shape: tuple[int, ...]
) -> None:
    src, dst = _random_pairs(mesh_text, shape, 1500, seed=len(shape) * 101 + len(mesh_text))
    kernel = pair_costs(make_mesh(mesh_text), shape, 2, src, dst)
    reference = _reference(mesh_text, shape, src, dst)
    _assert_same_seconds(kernel, reference)
    assert np.isinf(reference).any() and (reference == 0).any()
    if make_mesh(mesh_text).size > 1 and shape:
        assert (np.isfinite(reference) & (reference > 0)).any()


@pytest.mark.parametrize("mesh_text", ["4", "2x4", "4x4x4", "2x1x4"])
def test_a_matrix_of_repeated_specs_is_each_pairs_reference_cost(mesh_text: str) -> None:
    mesh, shape = make_mesh(mesh_text), (24, 10, 7)
    rng = np.random.default_rng(mesh.size)
    pool = np.array(list(itertools.product(_codes(len(shape)), repeat=mesh.ndim)), dtype=np.int16)
    src = pool[rng.integers(0, len(pool), 90)]  # repeated rows: the table is priced once per distinct spec
    dst = pool[rng.integers(0, len(pool), 70)]
    matrix = redistribute_matrix(mesh, shape, 2, src, dst)
    pairs_src = np.repeat(src, len(dst), axis=0)
    pairs_dst = np.tile(dst, (len(src), 1))
    assert matrix.shape == (len(src), len(dst))
    _assert_same_seconds(matrix.ravel(), _reference(mesh_text, shape, pairs_src, pairs_dst))


def test_a_matrix_is_a_new_array_its_caller_may_scale_in_place() -> None:
    mesh, specs = make_mesh("2x4"), np.array([[0, R], [R, 1], [P, R]], dtype=np.int16)
    first = redistribute_matrix(mesh, (8, 8), 4, specs, specs)
    first[:] = -1.0
    second = redistribute_matrix(mesh, (8, 8), 4, specs, specs)
    assert second.flags.writeable and (second >= 0).all()


def test_an_edge_written_into_its_place_is_the_matrix_scaled_step_by_step() -> None:
    """The builder writes each edge into the problem's one array, scaled as it goes: the same floats as the
    expanded matrix times the overlap factor, over the cost unit, times the layer weight, in turn."""
    mesh = make_mesh("2x2x2")
    src = np.array([[0, R, 1], [R, R, R], [P, 0, R], [0, R, 1]], dtype=np.int16)
    dst = np.array([[R, 1, 0], [0, 0, R], [R, R, R]], dtype=np.int16)
    expected = redistribute_matrix(mesh, (6, 10), 2, src, dst)
    expected *= 0.3
    expected /= 1e-6
    expected *= 7.0
    buffer = np.full(20, -1.0)
    place = buffer[3:15].reshape(4, 3)
    expand_into(*redistribute_parts(mesh, (6, 10), 2, src, dst), 0.3, 1e-6, 7.0, place)
    np.testing.assert_array_equal(place, expected)
    assert (buffer[:3] == -1.0).all() and (buffer[15:] == -1.0).all()


@pytest.mark.parametrize(
    ("src", "dst"),
    [((0, R), (P, R)), ((P, R), (P_MAX, R)), ((R, P_AVG), (R, P)), ((1, 0), (P_MASK, 0)), ((R, 1), (R, P))],
)
def test_a_partial_target_reached_from_neither_replicate_nor_itself_is_infinite(
    src: tuple[int, int], dst: tuple[int, int]
) -> None:
    mesh = make_mesh("2x4")
    assert pair_costs(mesh, (8, 8), 4, np.array([src]), np.array([dst]))[0] == np.inf
    assert redistribute_s(mesh, (8, 8), 4, src, dst) == np.inf


def test_an_unread_input_and_a_missing_source_tensor_cost_nothing() -> None:
    mesh = make_mesh("2x4")
    src = np.array([[0, 1], [P, R], [NONE, NONE]])
    dst = np.array([[NONE, R], [R, NONE], [0, P]])
    assert (pair_costs(mesh, (8, 8), 4, src, dst) == 0).all()
    assert redistribute_s(mesh, (8, 8), 4, (NONE, NONE), (0, P)) == 0


def test_a_shard_of_a_dim_the_tensor_lacks_is_refused() -> None:
    with pytest.raises(ValueError, match="not a placement of a 2-d tensor"):
        pair_costs(make_mesh("4"), (8, 8), 4, np.array([[2]]), np.array([[R]]))


def test_the_collective_formulas_are_read_from_one_row_of_terms_per_axis() -> None:
    mesh = make_mesh("16x1x8")  # axis 0 crosses nodes, axis 1 has one device
    terms = axis_terms(mesh)
    assert terms.shape[0] == 3 and not terms.flags.writeable
    assert all_reduce_s(mesh, 1, 2**20) == all_to_all_s(mesh, 1, 2**20) == 0.0
    link, launch = mesh.links[2], mesh.hardware.collective_launch_s
    ring = 2 * 7 * link.latency + 2 * 7 / 8 * 2**30 / link.bandwidth
    tree = 2 * 3 * link.latency + 2 * 2**30 / link.bandwidth
    assert all_reduce_s(mesh, 2, 2**30) == launch + min(ring, tree)


def test_a_masked_partial_is_reduced_before_another_axis_reshapes_it() -> None:
    """DTensor's P(mask) keeps a mask of the lookup's local shape: slicing or gathering on another axis first
    leaves a mask that no longer fits the value (an IndexError at the reduction), so that order is refused.
    From a sharded value DTensor works inside out, reducing the mask partial first: allowed."""
    mesh, shape = make_mesh("2x2"), (4, 16, 64)
    refused = [((R, P_MASK), (0, R)), ((R, P_MASK), (1, 0)), ((R, R, P_MASK), (R, 0, R))]
    allowed = [
        ((R, P_MASK), (R, R)),
        ((0, P_MASK), (0, R)),
        ((0, P_MASK), (0, 1)),
        ((R, P_MASK), (R, 0)),
        ((0, P_MASK), (R, R)),
        ((0, P_MASK), (1, R)),
    ]
    for src, dst in refused + allowed:
        mesh = make_mesh("2x2x2" if len(src) == 3 else "2x2")
        kernel = pair_costs(mesh, shape, 2, np.array([src]), np.array([dst]))[0]
        assert kernel == redistribute_s(mesh, shape, 2, src, dst), (src, dst)
        assert np.isinf(kernel) == ((src, dst) in refused), (src, dst, kernel)
