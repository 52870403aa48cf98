"""The numba side of `strategies.cost.comm`: alpha-beta seconds of collectives, and a kernel pricing many
redistributions at once.

**Collectives.** An axis of ``n`` devices with link bandwidth ``B`` bytes/s, per-hop latency ``a`` s and
fixed start cost ``c`` s (``hardware.collective_launch_s``) moves ``S`` bytes per device in

- one ring pass (all-gather of ``S`` output bytes, reduce-scatter of ``S`` input bytes, all-to-all of
  ``S`` bytes):  ``c + (n-1) a + (n-1)/n * S / B``
- an all-reduce, the cheaper of ring and tree (the tree only on an axis that crosses nodes, as NCCL runs
  it): ``c + min(2(n-1) a + 2(n-1)/n * S / B,  2 ceil(log2 n) a + 2 S / B)``

and in 0 s when ``n == 1``. :func:`axis_terms` turns a mesh into one row of constants per axis;
:func:`ring_pass_s` and :func:`all_reduce_s` evaluate the formulas for one axis. They are the only copy
of the formulas: the kernel inlines them, and `strategies.cost.comm` runs their Python bodies
(``.py_func``), which give the same floats without compiling anything.

**Redistribution.** A pair of specs (``src``, ``dst``: ``[mesh.ndim]`` placement codes) costs what
:func:`strategies.cost.comm.redistribute_steps` adds up, step for step and in the same order:

1. 0 s when the specs are equal or ``dst`` holds ``NONE`` (the consumer does not read the tensor);
   ``NONE`` in ``src`` reads as ``R``.
2. inf when an axis wants a partial ``P(x)`` and holds neither ``R`` nor ``P(x)``: whatever else
   happens, that axis moves once from its source placement to ``P(x)``, which DTensor cannot do. Every
   other step is finite, so this is the whole test for impossible pairs.
3. When the mesh has more than one axis and ``src`` cuts the tensor into more than one piece, nested
   sharding is undone from the innermost axis out: an axis whose target ``S(d)`` is sharded differently
   on an outer axis (now versus wanted) is replicated first.
4. Every axis still different moves from its current to its target placement.

A step is an all-gather (``S -> R``, bytes of the local piece after), all-to-all (``S(e) -> S(d)``),
all-reduce (``P -> R``) or reduce-scatter (``P -> S``, bytes before), and free from ``R``. The bytes of
the largest local piece of every spec of the tensor are read from a table (``lookup``, index ``(spec -
P_MASK) @ weights``, see ``strategies.cost.comm._bytes_table``).

Formulas and kernel share this file on purpose: numba's on-disk cache (``cache=True``) is renewed when
the file of the compiled function changes, not when a function it calls in another file does (the
placement codes of `strategies.placement` are compiled in as constants the same way).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from numba import njit

from strategies.cost.mesh import Mesh
from strategies.placement import NONE, P_MASK, P, R

INF = np.inf

# Columns of a row of :func:`axis_terms`.
LAUNCH = 0
"""``c``; 0 on an axis of one device."""
RING_CONSTANT = 1
"""``c + (n-1) a``: the part of a ring pass that does not depend on the bytes."""
RING_SHARE = 2
"""``(n-1)/n``: the share of ``S`` a ring pass sends."""
ALL_REDUCE_RING_CONSTANT = 3
"""``2(n-1) a``."""
ALL_REDUCE_RING_SHARE = 4
"""``2(n-1)/n``."""
ALL_REDUCE_TREE_CONSTANT = 5
"""``2 ceil(log2 n) a``."""
ALL_REDUCE_TREE_SHARE = 6
"""``2``."""
BANDWIDTH = 7
"""``B`` in bytes/s."""
TERMS = 8


@lru_cache(maxsize=256)
def axis_terms(mesh: Mesh) -> np.ndarray:
    """``float64 [mesh.ndim, TERMS]``: the constants of every axis's collectives (read-only).

    An axis of one device has every term 0 but its bandwidth, so each formula gives exactly 0.
    """
    terms = np.zeros((mesh.ndim, TERMS))
    for axis, (n, link) in enumerate(zip(mesh.shape, mesh.links, strict=True)):
        terms[axis, BANDWIDTH] = link.bandwidth
        if n == 1:
            continue
        launch = mesh.hardware.collective_launch_s
        terms[axis, LAUNCH] = launch
        terms[axis, RING_CONSTANT] = launch + (n - 1) * link.latency
        terms[axis, RING_SHARE] = (n - 1) / n
        terms[axis, ALL_REDUCE_RING_CONSTANT] = 2 * (n - 1) * link.latency
        terms[axis, ALL_REDUCE_RING_SHARE] = 2 * (n - 1) / n
        # NCCL's trees run across nodes; inside a node an all-reduce is a ring (or NVLink SHARP, which the
        # link's bus bandwidth does not count)
        crosses = mesh.crosses_nodes(axis)
        terms[axis, ALL_REDUCE_TREE_CONSTANT] = 2 * math.ceil(math.log2(n)) * link.latency if crosses else INF
        terms[axis, ALL_REDUCE_TREE_SHARE] = 2.0
    terms.flags.writeable = False
    return terms


@njit(inline="always")
def ring_pass_s(terms: np.ndarray, axis: int, nbytes: float) -> float:
    """Seconds of one ring pass on ``axis`` moving ``nbytes`` per device (``terms``: :func:`axis_terms`)."""
    return terms[axis, RING_CONSTANT] + terms[axis, RING_SHARE] * nbytes / terms[axis, BANDWIDTH]


@njit(inline="always")
def all_reduce_s(terms: np.ndarray, axis: int, nbytes: float) -> float:
    """Seconds of an all-reduce of ``nbytes`` on ``axis``: launch plus the cheaper of ring and tree."""
    bandwidth = terms[axis, BANDWIDTH]
    ring = terms[axis, ALL_REDUCE_RING_CONSTANT] + terms[axis, ALL_REDUCE_RING_SHARE] * nbytes / bandwidth
    tree = terms[axis, ALL_REDUCE_TREE_CONSTANT] + terms[axis, ALL_REDUCE_TREE_SHARE] * nbytes / bandwidth
    return terms[axis, LAUNCH] + min(ring, tree)


@njit(inline="always")
def step_s(terms: np.ndarray, axis: int, have: int, want: int, before: float, after: float) -> float:
    """Seconds of moving ``axis`` from ``have`` to ``want`` (a possible move) with ``before`` / ``after``
    local bytes."""
    if have == R:  # R -> S(d) slices locally; R -> P keeps the value on one rank (DTensor's rule)
        return 0.0
    if have >= 0:
        return ring_pass_s(terms, axis, after if want == R else before)  # all-gather, all-to-all
    if want == R:
        return all_reduce_s(terms, axis, before)
    return ring_pass_s(terms, axis, before)  # reduce-scatter


@njit(inline="always")
def _masked_elsewhere(state: np.ndarray, axis: int) -> bool:
    """Whether an axis other than ``axis`` holds ``P(mask)``: its mask was made for the local shape of the
    lookup, so a step that reshapes the local piece first leaves DTensor a mask that no longer fits."""
    masked = False  # a loop, not any(): numba compiles no generator here
    for other in range(len(state)):
        masked = masked or (other != axis and state[other] == P_MASK)
    return masked


def spec_seconds(
    src: np.ndarray,
    dst: np.ndarray,
    sizes: np.ndarray,
    lookup: np.ndarray,
    weights: np.ndarray,
    terms: np.ndarray,
    every_pair: bool,
) -> np.ndarray:
    """Seconds of redistributing between specs (``int64 [n, mesh.ndim]``; ``sizes`` are the mesh's axis
    sizes): with ``every_pair``, ``float64 [len(src), len(dst)]`` between every spec of ``src`` and every
    spec of ``dst``; else ``float64 [len(src)]``, each pair ``(src[k], dst[k])``."""
    seconds = _seconds(src, dst, not every_pair, sizes, lookup, weights, terms)
    return seconds.reshape(len(src), len(dst)) if every_pair else seconds


@njit(cache=True)
def _seconds(
    src: np.ndarray,
    dst: np.ndarray,
    pairwise: bool,
    sizes: np.ndarray,
    lookup: np.ndarray,
    weights: np.ndarray,
    terms: np.ndarray,
) -> np.ndarray:
    """Seconds from ``src[i]`` to ``dst[j]`` for every ``(i, j)`` (row-major), or for ``i == j`` only when
    ``pairwise``. One loop body, no per-pair function taking arrays: such a call costs more than a pair."""
    axes = len(sizes)
    seconds = np.zeros(len(src) if pairwise else len(src) * len(dst))
    state = np.empty(axes, dtype=np.int64)
    for i in range(len(src)):
        for j in range(i, i + 1) if pairwise else range(len(dst)):
            out = i if pairwise else i * len(dst) + j
            same, reads, possible = True, True, True
            for axis in range(axes):
                have, want = src[i, axis], dst[j, axis]
                same = same and have == want
                reads = reads and want != NONE
                possible = possible and (want > P or have in (R, NONE, want))
            if same or not reads:
                continue
            if not possible:
                seconds[out] = INF
                continue
            key, pieces = 0, 1
            for axis in range(axes):
                code = R if src[i, axis] == NONE else src[i, axis]
                state[axis] = code
                key += (code - P_MASK) * weights[axis]
                pieces *= sizes[axis] if code >= 0 else 1
            total = 0.0
            if axes > 1 and pieces > 1:
                for axis in range(axes - 1, -1, -1):  # undo nested sharding from the inside out
                    want = dst[j, axis]
                    for outer in range(axis if want >= 0 else 0):
                        if (state[outer] == want) != (dst[j, outer] == want):
                            want = R
                            break
                    have = state[axis]
                    if have != want:
                        if (have >= 0 or want >= 0) and _masked_elsewhere(state, axis):
                            total = INF
                        moved = key + (want - have) * weights[axis]
                        total += step_s(terms, axis, have, want, lookup[key], lookup[moved])
                        key, state[axis] = moved, want
            for axis in range(axes):
                want, have = dst[j, axis], state[axis]
                if have != want:
                    if (have >= 0 or want >= 0) and _masked_elsewhere(state, axis):
                        total = INF
                    moved = key + (want - have) * weights[axis]
                    total += step_s(terms, axis, have, want, lookup[key], lookup[moved])
                    key, state[axis] = moved, want
            seconds[out] = total
    return seconds


@njit(cache=True)
def expand(table: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """``table[rows][:, cols]`` as one new array, written once (numpy's ``np.ix_`` indexing is 3-5 times
    slower, two ``take`` calls allocate a second large array)."""
    out = np.empty((len(rows), len(cols)))
    expand_into(table, rows, cols, 1.0, 1.0, 1.0, out)
    return out


@njit(cache=True)
def expand_into(
    table: np.ndarray,
    rows: np.ndarray,
    cols: np.ndarray,
    factor: float,
    divisor: float,
    weight: float,
    out: np.ndarray,
) -> None:
    """``out[i, j] = table[rows[i], cols[j]] * factor / divisor * weight``, in that order (the same floats as
    scaling the expanded matrix step by step): a problem's edges are written straight into its one array."""
    for i in range(len(rows)):
        row = table[rows[i]]
        for j in range(len(cols)):
            out[i, j] = row[cols[j]] * factor / divisor * weight
