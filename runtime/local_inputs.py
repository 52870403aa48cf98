"""Which part of each input a rank loads under a plan, and a rank's parts made the step's DTensors.

A data loader gives each rank its own part of the batch; the plan's input placements say which: under
``[S(0), R]`` on a (dp=2, tp=2) mesh, ranks 0 and 1 (dp coordinate 0) load the first half of the batch
rows, ranks 2 and 3 the second. :func:`input_slices` gives, per input, the index (one slice per dim) of this
rank's part of the global tensor, exactly as DTensor cuts a tensor (its own
``_compute_local_shape_and_global_offset``: ``torch.chunk``'s sizes, the last pieces smaller or empty), so
``global_input[slices]`` is what the rank holds when the step is given global inputs. Ranks are laid out on
the mesh in row-major order, as ``init_device_mesh`` lays them out. A pipeline plan's rank loads its part
(on its stage's mesh) of every micro-batch (:func:`microbatch_slices`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset

from runtime.plan_checks import Placements, PlanMismatch


def mesh_coordinate(rank: int, mesh_shape: Sequence[int]) -> list[int]:
    """The coordinate of ``rank`` on a mesh of ``mesh_shape`` laid out in row-major order."""
    if not 0 <= rank < math.prod(mesh_shape):
        raise ValueError(f"rank: {rank} is not on a mesh of {math.prod(mesh_shape)} devices")
    coordinate = []
    for size in reversed(mesh_shape):
        rank, index = divmod(rank, size)
        coordinate.append(index)
    return coordinate[::-1]


def part_of(
    shape: Sequence[int],
    mesh_shape: Sequence[int],
    coordinate: Sequence[int],
    placements: Placements,
    where: str,
) -> tuple[slice, ...]:
    """The slices of a ``shape`` tensor that the device at ``coordinate`` holds in ``placements``."""
    if any(p.is_partial() for p in placements):
        raise PlanMismatch(
            f"{where} is planned as a partial sum: no rank loads a part of it; pass global inputs"
        )
    local, offset = _compute_local_shape_and_global_offset(
        tuple(shape), tuple(mesh_shape), list(coordinate), placements
    )
    return tuple(slice(start, start + size) for start, size in zip(offset, local, strict=True))


def input_slices(
    placements: Sequence[Placements | None],
    shapes: Sequence[Sequence[int]],
    mesh_shape: Sequence[int],
    coordinate: Sequence[int],
) -> list[tuple[slice, ...]]:
    """Per input of the step (its ``placements`` and global ``shapes``, in the step's input order:
    :func:`runtime.plan_checks.input_placements`), the part the device at ``coordinate`` loads."""
    slices = []
    for k, (shape, placed) in enumerate(zip(shapes, placements, strict=True)):
        assert placed is not None, f"input {k}: a plan places every input"
        slices.append(part_of(shape, mesh_shape, coordinate, placed, f"input {k}"))
    return slices


def microbatch_slices(part: tuple[slice, ...], microbatches: int, rows: int) -> list[tuple[slice, ...]]:
    """A device's part of each of a pipeline's ``microbatches`` micro-batches of ``rows`` rows, in the whole
    batch's rows (micro-batch ``i`` is rows ``i * rows`` to ``(i + 1) * rows``), from its ``part`` of one."""
    first, rest = part[0], part[1:]
    return [(slice(first.start + i * rows, first.stop + i * rows), *rest) for i in range(microbatches)]


__all__ = ["input_slices", "mesh_coordinate", "microbatch_slices", "part_of"]
