"""Communication costs: collectives on one mesh axis, and redistributing a tensor between specs.

Collectives are priced by the alpha-beta formulas of `strategies.cost.comm_kernel` (one ring pass for
all-gather, reduce-scatter and all-to-all; the cheaper of ring and tree for all-reduce; 0 s on an axis of
one device).

Redistribution follows the steps DTensor takes (its greedy planner in ``_redistribute.py``): first,
from the innermost axis out, axes whose target shards a tensor dim that is sharded differently on an
outer axis are replicated (nested sharding must be undone from the inside); then every axis still
different moves from its current to its target placement. Per axis step:

======================  ===========================  ===========================
from \\ to              ``R``                        ``S(d)``                       ``P``
``S(e)``                all-gather                   all-to-all (d != e)            impossible (inf)
``R``                   —                            local slice (free)             free (DTensor's rule)
``P``                   all-reduce                   reduce-scatter                 impossible unless equal
======================  ===========================  ===========================

A step that reshapes the local piece (a gather, a slice, an all-to-all) while another axis holds ``P(mask)``
is impossible: DTensor's mask was made for the lookup's local shape and no longer fits it (the mask partial
has to be reduced first).

Bytes at each step are those of the largest local piece at that moment (uneven shards count the
largest piece). :func:`redistribute_steps` and :func:`redistribute_s` apply these rules step by step (the
reference, and the steps a plan reports); a whole ``[producer strategy, consumer strategy]`` matrix is priced
by the numba kernel of `strategies.cost.comm_kernel` on the distinct specs only, then expanded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from strategies.cost import comm_kernel
from strategies.cost.comm_kernel import axis_terms
from strategies.cost.mesh import Mesh
from strategies.placement import NONE, P_MASK, R, Spec, is_partial, is_shard

INF = float("inf")


def all_gather_s(mesh: Mesh, axis: int, out_bytes: float) -> float:
    return float(_ring_pass_s(axis_terms(mesh), axis, float(out_bytes)))


def reduce_scatter_s(mesh: Mesh, axis: int, in_bytes: float) -> float:
    return float(_ring_pass_s(axis_terms(mesh), axis, float(in_bytes)))


def all_to_all_s(mesh: Mesh, axis: int, nbytes: float) -> float:
    return float(_ring_pass_s(axis_terms(mesh), axis, float(nbytes)))


def all_reduce_s(mesh: Mesh, axis: int, nbytes: float) -> float:
    return float(_all_reduce_s(axis_terms(mesh), axis, float(nbytes)))


# The kernel's formulas, run as Python: the same floats, and nothing compiled for one scalar.
_ring_pass_s = comm_kernel.ring_pass_s.py_func
_all_reduce_s = comm_kernel.all_reduce_s.py_func


@dataclass(frozen=True)
class Step:
    """One per-axis move of a redistribution: the collective, the axis, bytes per device, seconds."""

    axis: int
    src: int
    dst: int
    collective: str  # all_gather | all_to_all | all_reduce | reduce_scatter | local
    nbytes: float
    seconds: float


def dim_pieces(specs: np.ndarray, ndim: int, mesh_shape: tuple[int, ...]) -> np.ndarray:
    """``[n, ndim]``: how many pieces each tensor dim is cut into under ``specs`` (``[n, axes]``)."""
    sizes = np.asarray(mesh_shape, dtype=np.int64)
    pieces = np.ones((len(specs), ndim), dtype=np.int64)
    for d in range(ndim):
        pieces[:, d] = np.where(specs == d, sizes, 1).prod(axis=1)
    return pieces


def local_sizes(specs: np.ndarray, shape: tuple[int, ...], mesh_shape: tuple[int, ...]) -> np.ndarray:
    """``[n, ndim]`` sizes of the largest local piece: each dim ``ceil(size / pieces)`` (uneven shards)."""
    return -(-np.asarray(shape, dtype=np.int64) // dim_pieces(specs, len(shape), mesh_shape))


def local_numel(shape: tuple[int, ...], spec: Spec, mesh_shape: tuple[int, ...]) -> int:
    """Elements of the largest local piece of one spec."""
    return int(local_sizes(np.array([spec]), shape, mesh_shape).prod())


def redistribute_steps(mesh: Mesh, shape: tuple[int, ...], itemsize: int, src: Spec, dst: Spec) -> list[Step]:
    """The per-axis moves taking a tensor from ``src`` to ``dst``; a step of infinite cost when impossible.
    ``NONE`` in ``src`` (no tensor there) reads as ``R``: nothing to gather or reduce."""
    state = [R if code == NONE else code for code in src]
    steps: list[Step] = []

    def move(axis: int, want: int) -> None:
        steps.append(_step(mesh, shape, itemsize, state, axis, want))
        state[axis] = want

    sharded = math.prod(n for n, c in zip(mesh.shape, src, strict=False) if is_shard(c)) > 1
    if mesh.ndim > 1 and sharded:
        for axis in reversed(range(mesh.ndim)):  # undo nested sharding from the inside out
            want = dst[axis]
            if is_shard(want):
                outer_now = [i for i in range(axis) if state[i] == want]
                outer_want = [i for i in range(axis) if dst[i] == want]
                if outer_now != outer_want:
                    want = R
            if state[axis] != want:
                move(axis, want)
    for axis in range(mesh.ndim):
        if state[axis] != dst[axis]:
            move(axis, dst[axis])
    return steps


def _step(mesh: Mesh, shape: tuple[int, ...], itemsize: int, state: list[int], axis: int, want: int) -> Step:
    have = state[axis]
    if (is_shard(have) or is_shard(want)) and any(c == P_MASK for i, c in enumerate(state) if i != axis):
        return Step(axis, have, want, "impossible", 0, INF)  # a P(mask) elsewhere: its mask would not fit
    before = local_numel(shape, tuple(state), mesh.shape) * itemsize
    after_state = list(state)
    after_state[axis] = want
    after = local_numel(shape, tuple(after_state), mesh.shape) * itemsize
    if is_shard(have) and want == R:
        return Step(axis, have, want, "all_gather", after, all_gather_s(mesh, axis, after))
    if is_shard(have) and is_shard(want):
        return Step(axis, have, want, "all_to_all", before, all_to_all_s(mesh, axis, before))
    if is_partial(have) and want == R:
        return Step(axis, have, want, "all_reduce", before, all_reduce_s(mesh, axis, before))
    if is_partial(have) and is_shard(want):
        return Step(axis, have, want, "reduce_scatter", before, reduce_scatter_s(mesh, axis, before))
    if have == R:  # R -> S(d) slices locally; R -> P keeps the value on one rank (DTensor's internal rule)
        return Step(axis, have, want, "local", 0, 0.0)
    return Step(axis, have, want, "impossible", 0, INF)  # S -> P, P -> P'


def fixed_seconds(mesh: Mesh, step: Step) -> float:
    """The part of a step's seconds that does not depend on its bytes (launch and per-hop latency): what
    moving several tensors in one collective (a bucket) pays once rather than per tensor."""
    if step.collective == "all_reduce":
        return all_reduce_s(mesh, step.axis, 0.0)
    if step.collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return all_gather_s(mesh, step.axis, 0.0)
    return 0.0


@lru_cache(maxsize=1 << 18)
def redistribute_s(mesh: Mesh, shape: tuple[int, ...], itemsize: int, src: Spec, dst: Spec) -> float:
    """Seconds to move a tensor from ``src`` to ``dst`` (inf when DTensor cannot)."""
    if src == dst or NONE in dst:  # NONE: the consumer does not read this tensor
        return 0.0
    return sum(step.seconds for step in redistribute_steps(mesh, shape, itemsize, src, dst))


def redistribute_matrix(
    mesh: Mesh, shape: tuple[int, ...], itemsize: int, src_specs: np.ndarray, dst_specs: np.ndarray
) -> np.ndarray:
    """``[len(src_specs), len(dst_specs)]`` seconds, a new array; specs are ``[n, mesh.ndim]`` integer arrays.

    The table is priced between the distinct specs only (and cached, the same edges recur in every layer),
    then expanded to every pair of specs.
    """
    return comm_kernel.expand(*redistribute_parts(mesh, shape, itemsize, src_specs, dst_specs))


def redistribute_parts(
    mesh: Mesh, shape: tuple[int, ...], itemsize: int, src_specs: np.ndarray, dst_specs: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`redistribute_matrix` before its expansion: the table between the distinct specs (read only,
    cached) and the row of each source and the column of each destination spec in it."""
    src_keys, src_index = _distinct_specs(src_specs)
    dst_keys, dst_index = _distinct_specs(dst_specs)
    return _cost_table(mesh, tuple(shape), itemsize, src_keys, dst_keys), src_index, dst_index


def _distinct_specs(specs: np.ndarray) -> tuple[bytes, np.ndarray]:
    """:func:`_unique_rows` as the bytes of the distinct rows (a key of :func:`_cost_table`) and each row's
    index among them, cached by the rows' bytes: a node's specs recur on all its edges and in every layer."""
    rows = np.ascontiguousarray(specs)
    return _distinct_rows(rows.tobytes(), rows.dtype.str, rows.shape)


@lru_cache(maxsize=1 << 10)
def _distinct_rows(data: bytes, dtype: str, shape: tuple[int, ...]) -> tuple[bytes, np.ndarray]:
    unique, index = _unique_rows(np.frombuffer(data, dtype=dtype).reshape(shape))
    index.flags.writeable = False
    return unique.tobytes(), index


def _unique_rows(specs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct rows of ``specs`` (int64, C order) and each row's index among them. A row is read as
    one integer (placement codes are small: -100 to a tensor's dims), so this is a 1-D unique."""
    rows = np.asarray(specs, dtype=np.int64).reshape(len(specs), -1)
    if rows.shape[1] > SPEC_CODE_DIGITS:  # more axes than one int64 holds: rows compared as rows
        unique, inverse = np.unique(rows, axis=0, return_inverse=True)
        return np.ascontiguousarray(unique), inverse.ravel()
    code = (rows + SPEC_CODE_OFFSET) @ (SPEC_CODE_BASE ** np.arange(rows.shape[1], dtype=np.int64))
    _, first, inverse = np.unique(code, return_index=True, return_inverse=True)
    return np.ascontiguousarray(rows[first]), inverse.ravel()


SPEC_CODE_OFFSET, SPEC_CODE_BASE, SPEC_CODE_DIGITS = 128, 256, 7
"""Placement codes (-128 to 127) as digits of one int64 per spec row: up to 7 mesh axes (256**7 < 2**63)."""


@lru_cache(maxsize=1 << 14)
def _cost_table(
    mesh: Mesh, shape: tuple[int, ...], itemsize: int, src_keys: bytes, dst_keys: bytes
) -> np.ndarray:
    """``[src, dst]`` seconds between distinct specs (given as the bytes of int64 ``[n, mesh.ndim]``
    arrays); cached because the same edges recur in every layer."""
    src = _checked(np.frombuffer(src_keys, dtype=np.int64).reshape(-1, mesh.ndim), shape)
    dst = _checked(np.frombuffer(dst_keys, dtype=np.int64).reshape(-1, mesh.ndim), shape)
    table = comm_kernel.spec_seconds(src, dst, *_kernel_arguments(mesh, shape, itemsize), every_pair=True)
    table.flags.writeable = False
    return table


def pair_costs(
    mesh: Mesh, shape: tuple[int, ...], itemsize: int, src: np.ndarray, dst: np.ndarray
) -> np.ndarray:
    """Seconds for many (src, dst) spec pairs (``[n, mesh.ndim]`` each) at once: the rules of
    :func:`redistribute_steps`, run by a numba kernel one pair at a time."""
    src = _checked(np.ascontiguousarray(src, dtype=np.int64).reshape(-1, mesh.ndim), shape)
    dst = _checked(np.ascontiguousarray(dst, dtype=np.int64).reshape(-1, mesh.ndim), shape)
    if len(src) != len(dst):
        raise ValueError(f"pair_costs: {len(src)} source specs for {len(dst)} target specs")
    return comm_kernel.spec_seconds(
        src, dst, *_kernel_arguments(mesh, tuple(shape), itemsize), every_pair=False
    )


def _checked(specs: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``specs``, refused when a code is not a placement of a tensor of ``shape`` (the kernels index the bytes
    table with the codes and do not check bounds)."""
    if specs.size and ((specs >= len(shape)) | ((specs < P_MASK) & (specs != NONE))).any():
        raise ValueError(f"not a placement of a {len(shape)}-d tensor in {np.unique(specs).tolist()}")
    return specs


def _kernel_arguments(
    mesh: Mesh, shape: tuple[int, ...], itemsize: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """What the kernels read besides the specs: axis sizes, the bytes table and its weights, axis terms."""
    lookup, weights = _bytes_table(mesh, shape, itemsize)
    return np.asarray(mesh.shape, dtype=np.int64), lookup, weights, axis_terms(mesh)


@lru_cache(maxsize=4096)
def _bytes_table(mesh: Mesh, shape: tuple[int, ...], itemsize: int) -> tuple[np.ndarray, np.ndarray]:
    """Local bytes of every spec of a tensor, indexed by ``(spec - P_MASK) @ weights``: a spec is a number in
    base ``ndim + 6``, its digits the placement codes ``P_MASK`` to ``S(ndim - 1)`` shifted to start at 0."""
    base = len(shape) - P_MASK
    weights = base ** np.arange(mesh.ndim - 1, -1, -1, dtype=np.int64)
    digits = np.indices((base,) * mesh.ndim).reshape(mesh.ndim, -1).T + P_MASK
    numel = local_sizes(digits, shape, mesh.shape).prod(axis=1).astype(np.float64)
    return numel * itemsize, weights


def clear_cache() -> None:
    """Forget every cached redistribution cost (benchmarks time cold runs)."""
    redistribute_s.cache_clear()
    _distinct_rows.cache_clear()
    _cost_table.cache_clear()
    _bytes_table.cache_clear()
    axis_terms.cache_clear()
