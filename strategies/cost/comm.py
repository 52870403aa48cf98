"""Communication costs: collectives on one mesh axis, and redistributing a tensor between specs.

Collectives (alpha-beta; ``n`` devices on the axis, link bandwidth ``B`` bytes/s, per-hop latency
``a`` s, fixed start cost ``c`` s = ``hardware.collective_launch_s``):

- all-gather producing ``S`` bytes per device:   ``c + (n-1) a + (n-1)/n * S / B``            (ring)
- reduce-scatter of ``S`` input bytes per device: ``c + (n-1) a + (n-1)/n * S / B``            (ring)
- all-reduce of ``S`` bytes: ``c + min(2(n-1) a + 2(n-1)/n * S/B,  2 ceil(log2 n) a + 2 S/B)`` (ring, tree)
- all-to-all of ``S`` bytes per device:          ``c + (n-1) a + (n-1)/n * S / B``

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

Bytes at each step are those of the largest local piece at that moment (uneven shards count the
largest piece). The cost of a pair of specs is cached by (mesh, shape, itemsize, src, dst); a whole
``[producer strategy, consumer strategy]`` matrix is built from the distinct specs only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from strategies.cost.mesh import Mesh
from strategies.placement import NONE, P_MASK, P, R, Spec, is_partial, is_shard

INF = float("inf")


def all_gather_s(mesh: Mesh, axis: int, out_bytes: float) -> float:
    return _ring_s(mesh, axis, out_bytes)


def reduce_scatter_s(mesh: Mesh, axis: int, in_bytes: float) -> float:
    return _ring_s(mesh, axis, in_bytes)


def all_to_all_s(mesh: Mesh, axis: int, nbytes: float) -> float:
    return _ring_s(mesh, axis, nbytes)


def all_reduce_s(mesh: Mesh, axis: int, nbytes: float) -> float:
    n = mesh.shape[axis]
    if n == 1:
        return 0.0
    link = mesh.links[axis]
    ring = 2 * (n - 1) * link.latency + 2 * (n - 1) / n * nbytes / link.bandwidth
    tree = 2 * math.ceil(math.log2(n)) * link.latency + 2 * nbytes / link.bandwidth
    return mesh.hardware.collective_launch_s + np.minimum(ring, tree)


def _ring_s(mesh: Mesh, axis: int, nbytes: float) -> float:
    """``c + (n-1) a + (n-1)/n * S / B``: one pass around the ring of the axis."""
    n = mesh.shape[axis]
    if n == 1:
        return 0.0
    link = mesh.links[axis]
    return mesh.hardware.collective_launch_s + (n - 1) * link.latency + (n - 1) / n * nbytes / link.bandwidth


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
    """The per-axis moves taking a tensor from ``src`` to ``dst``; a step of infinite cost when impossible."""
    state = list(src)
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


@lru_cache(maxsize=1 << 18)
def redistribute_s(mesh: Mesh, shape: tuple[int, ...], itemsize: int, src: Spec, dst: Spec) -> float:
    """Seconds to move a tensor from ``src`` to ``dst`` (inf when DTensor cannot)."""
    if src == dst or NONE in dst:  # NONE: the consumer does not read this tensor
        return 0.0
    return sum(step.seconds for step in redistribute_steps(mesh, shape, itemsize, src, dst))


def redistribute_matrix(
    mesh: Mesh, shape: tuple[int, ...], itemsize: int, src_specs: np.ndarray, dst_specs: np.ndarray
) -> np.ndarray:
    """``[len(src_specs), len(dst_specs)]`` seconds; specs are ``[n, mesh.ndim]`` integer arrays."""
    src_unique, src_index = _unique_rows(src_specs)
    dst_unique, dst_index = _unique_rows(dst_specs)
    small = _cost_table(mesh, tuple(shape), itemsize, src_unique.tobytes(), dst_unique.tobytes())
    return small[np.ix_(src_index, dst_index)]


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
    src = np.frombuffer(src_keys, dtype=np.int64).reshape(-1, mesh.ndim)
    dst = np.frombuffer(dst_keys, dtype=np.int64).reshape(-1, mesh.ndim)
    pairs_src = np.repeat(src, len(dst), axis=0)
    pairs_dst = np.tile(dst, (len(src), 1))
    table = pair_costs(mesh, shape, itemsize, pairs_src, pairs_dst).reshape(len(src), len(dst))
    table.flags.writeable = False
    return table


def pair_costs(
    mesh: Mesh, shape: tuple[int, ...], itemsize: int, src: np.ndarray, dst: np.ndarray
) -> np.ndarray:
    """Seconds for many (src, dst) spec pairs at once: :func:`redistribute_steps` run on arrays.

    Both phases of DTensor's planner are applied to all pairs together, one mesh axis at a time; the
    local bytes of every state come from a table over all specs of the tensor (a spec is a number in
    base ``ndim + 7``).
    """
    lookup, weights = _bytes_table(mesh, tuple(shape), itemsize)
    state = np.where(src == NONE, R, src).astype(np.int64)
    key = (state - _LOWEST) @ weights
    cost = np.zeros(len(src))

    def move(axis: int, want: np.ndarray, moving: np.ndarray) -> None:
        nonlocal key
        rows = np.flatnonzero(moving)
        if not len(rows):
            return
        have, to = state[rows, axis], want[rows]
        new_key = key[rows] + (np.where(to == NONE, R, to) - have) * weights[axis]
        cost[rows] += _step_costs(mesh, axis, have, to, lookup[key[rows]], lookup[new_key])
        state[rows, axis] = to
        key[rows] = new_key

    if mesh.ndim > 1:
        sharded = np.where(state >= 0, np.asarray(mesh.shape), 1).prod(axis=1) > 1
        for axis in reversed(range(mesh.ndim)):  # undo nested sharding from the inside out
            want = dst[:, axis].copy()
            if axis:
                outer = (state[:, :axis] == want[:, None]) != (dst[:, :axis] == want[:, None])
                want[(want >= 0) & outer.any(axis=1)] = R
            move(axis, want, sharded & (state[:, axis] != want))
    for axis in range(mesh.ndim):
        move(axis, dst[:, axis], state[:, axis] != dst[:, axis])
    cost[(dst == NONE).any(axis=1) | (src == dst).all(axis=1)] = 0.0
    return cost


_LOWEST = P_MASK  # the smallest placement code


@lru_cache(maxsize=4096)
def _bytes_table(mesh: Mesh, shape: tuple[int, ...], itemsize: int) -> tuple[np.ndarray, np.ndarray]:
    """Local bytes of every spec of a tensor, indexed by ``(spec - P_MASK) @ weights``."""
    base = len(shape) - _LOWEST
    weights = base ** np.arange(mesh.ndim - 1, -1, -1, dtype=np.int64)
    digits = np.indices((base,) * mesh.ndim).reshape(mesh.ndim, -1).T + _LOWEST
    numel = local_sizes(digits, shape, mesh.shape).prod(axis=1).astype(np.float64)
    return numel * itemsize, weights


def _step_costs(
    mesh: Mesh, axis: int, have: np.ndarray, want: np.ndarray, before: np.ndarray, after: np.ndarray
) -> np.ndarray:
    """Seconds of moving ``axis`` from ``have`` to ``want`` (per pair), local bytes before and after."""
    have_shard, want_shard = have >= 0, want >= 0
    have_partial = (have <= P) & (have != NONE)
    cost = np.full(len(have), INF)
    cost[(have == R) | (want == NONE)] = 0.0
    gather = have_shard & (want == R)
    cost[gather] = all_gather_s(mesh, axis, after[gather])
    swap = have_shard & want_shard
    cost[swap] = all_to_all_s(mesh, axis, before[swap])
    reduce = have_partial & (want == R)
    cost[reduce] = all_reduce_s(mesh, axis, before[reduce])
    scatter = have_partial & want_shard
    cost[scatter] = reduce_scatter_s(mesh, axis, before[scatter])
    return cost


def clear_cache() -> None:
    """Forget every cached redistribution cost (benchmarks time cold runs)."""
    redistribute_s.cache_clear()
    _cost_table.cache_clear()
    _bytes_table.cache_clear()
