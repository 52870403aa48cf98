"""The candidates of a search: every mesh of N devices with 1 to ``max_mesh_dims`` axes, times the batches.

A mesh is an ordered factorisation of N into axes of size 2 or more (``8`` is ``8``, ``2x4``, ``4x2``,
``2x2x2``). Ranks are laid out row-major, so the last axis holds neighbouring ranks and runs inside a node
whenever it fits one (:meth:`strategies.cost.mesh.Mesh.crosses_nodes`). Axis roles follow that topology,
outermost first: ``dp`` (1-D); ``dp, tp`` (2-D: tensor parallel innermost, on the fast in-node link);
``dp, cp, tp`` (3-D: data, context, tensor parallel). The names are labels for people: the planner chooses
every placement on every axis itself, so ``4x2`` and ``2x4`` differ by which axis crosses nodes, not by
what each axis may do. The one exception is the pipeline: ``pp, dp, cp, tp`` and, beside every 3-D mesh,
``pp, dp, tp``, the outermost axis a pipeline (:mod:`strategies.plan.pipeline_plan`), tried only when asked
(``max_mesh_dims`` 4), only with batches
its stages divide (a pipeline runs at least one micro-batch per stage) and no more stages than the model has
layers (llama3-405b on 16,384 devices: 31 meshes of 128-2,048 stages for 126 layers, each failing after a
capture and a build).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

AXIS_ROLES = {1: ("dp",), 2: ("dp", "tp"), 3: ("dp", "cp", "tp"), 4: ("pp", "dp", "cp", "tp")}
"""Axis names by mesh rank, outermost first (the innermost axis is the one inside a node)."""
PIPELINE_WITHOUT_CP = ("pp", "dp", "tp")
"""The 3-axis pipeline a 4-axis search also tries: stages, data and tensor parallelism, the layout of most
published pipelined runs (Llama 3 405B: pp 16 x dp 128 x tp 8), which a 4-axis mesh with every axis of 2 or
more cannot be."""
PIPELINE_ROLE = AXIS_ROLES[4][0]
"""The name the planner reads as a pipeline axis (``strategies.plan.request.PIPELINE_AXIS``, not imported
here: it would bring torch into the service's start-up)."""
MAX_MESH_DIMS = 4
DEFAULT_MESH_DIMS = 3
"""A search's axes at most unless asked for more (the fourth is a pipeline)."""


@dataclass(frozen=True)
class Candidate:
    """One configuration of the search: a mesh shape (with its axis names) and a global batch."""

    id: str
    mesh: tuple[int, ...]
    axis_names: tuple[str, ...]
    batch: int
    seq: int | None

    @property
    def mesh_text(self) -> str:
        return "x".join(str(size) for size in self.mesh)

    @property
    def pipelined(self) -> bool:
        """Whether its outermost axis is a pipeline's (the 4-D role ``pp``)."""
        return self.axis_names[0] == PIPELINE_ROLE


def check_axis_limits(limits: Mapping[str, int]) -> dict[str, int]:
    """``limits`` checked: each a role a search's meshes have, at least 1."""
    roles = {role for names in AXIS_ROLES.values() for role in names}
    for role, size in limits.items():
        if role not in roles:
            raise ValueError(
                f"axis_limits: {role!r} is not an axis of a search's meshes ({', '.join(sorted(roles))})"
            )
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"axis_limits: {role} at most {size!r}; give a size of at least 1")
    return dict(limits)


def parse_axis_limits(text: str) -> dict[str, int]:
    """``"tp=8,pp=16"`` as ``{"tp": 8, "pp": 16}``."""
    limits: dict[str, int] = {}
    for part in filter(None, (piece.strip() for piece in text.split(","))):
        role, sep, size = part.partition("=")
        if not sep or not size.strip().isdigit():
            raise ValueError(f"axis_limits: {part!r}; write NAME=SIZE, e.g. tp=8")
        limits[role.strip()] = int(size)
    return check_axis_limits(limits)


def mesh_shapes(devices: int, max_dims: int = MAX_MESH_DIMS) -> list[tuple[int, ...]]:
    """Every ordered factorisation of ``devices`` into 1 to ``max_dims`` axes of size 2 or more (a single
    device is the 1-D mesh ``(1,)``), fewer axes first, then lexicographic."""
    if devices < 1:
        raise ValueError(f"devices: at least 1, got {devices}")
    if not 1 <= max_dims <= MAX_MESH_DIMS:
        raise ValueError(f"max_mesh_dims: 1 to {MAX_MESH_DIMS}, got {max_dims}")
    if devices == 1:
        return [(1,)]
    shapes = [shape for dims in range(1, max_dims + 1) for shape in _factorisations(devices, dims)]
    return sorted(shapes, key=lambda shape: (len(shape), shape))


def _factorisations(n: int, dims: int) -> Iterator[tuple[int, ...]]:
    if dims == 1:
        if n >= 2:
            yield (n,)
        return
    for first in range(2, n + 1):
        if n % first == 0:
            for rest in _factorisations(n // first, dims - 1):
                yield (first, *rest)


def make_candidates(
    devices: int,
    batch_sizes: Sequence[int],
    seq: int | None,
    max_dims: int = MAX_MESH_DIMS,
    axis_limits: Mapping[str, int] | None = None,
    max_stages: int | None = None,
) -> list[Candidate]:
    """Meshes times batch sizes, numbered ``c00``, ``c01``, … (mesh by mesh, batches in the order given; a
    pipeline's mesh only with the batches its stages divide); ``axis_limits``: the largest size an axis of
    that role may have (``{"tp": 8}``: tensor parallelism within a node's 8 GPUs); ``max_stages``: the most
    stages a pipeline may have (the model's layers; None: any)."""
    if not batch_sizes:
        raise ValueError("batch_sizes: give at least one batch size")
    if any(batch < 1 for batch in batch_sizes):
        raise ValueError(f"batch_sizes: every batch must be positive, got {list(batch_sizes)}")
    limits = check_axis_limits(axis_limits or {})
    ceilings = dict(limits)
    if max_stages is not None:
        ceilings[PIPELINE_ROLE] = min(limits.get(PIPELINE_ROLE, max_stages), max_stages)
    shapes = [
        shape for shape in mesh_shapes(devices, max_dims) if _within(shape, AXIS_ROLES[len(shape)], ceilings)
    ]
    if not shapes:
        raise ValueError(f"axis_limits: no mesh of {devices} devices keeps {limits}")
    families = [(shape, AXIS_ROLES[len(shape)]) for shape in shapes]
    if max_dims >= 4:  # the pipelines without context parallelism, after the 4-D ones
        families += [
            (shape, PIPELINE_WITHOUT_CP)
            for shape in mesh_shapes(devices, 3)
            if len(shape) == 3 and _within(shape, PIPELINE_WITHOUT_CP, ceilings)
        ]
    pairs = [
        (shape, names, batch)
        for shape, names in families
        for batch in batch_sizes
        if names[0] != PIPELINE_ROLE or batch % shape[0] == 0
    ]
    width = max(2, len(str(len(pairs) - 1)))
    return [
        Candidate(f"c{index:0{width}d}", shape, names, batch, seq)
        for index, (shape, names, batch) in enumerate(pairs)
    ]


def _within(shape: tuple[int, ...], names: tuple[str, ...], ceilings: Mapping[str, int]) -> bool:
    """Whether no axis of ``shape`` (named ``names``) is larger than its role's ceiling."""
    return all(size <= ceilings.get(role, size) for role, size in zip(names, shape, strict=True))
