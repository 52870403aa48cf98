"""The device mesh as the planner sees it: shape, axis names and the link each axis runs over.

Ranks are laid out row-major, so the last axis holds neighbouring ranks. An axis runs inside a node
when the devices it spans together with all axes inside it fit in one node (``prod(shape[i:]) <=
node_size``); otherwise its collectives cross nodes: over the inter-node link alone when each node holds
one device of a group, hierarchically (NVLink inside, every device's NIC across) when it holds several
(:func:`axis_link`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from strategies.cost.hardware import Hardware, Link, get_hardware
from strategies.cost.hashing import HashOnce


class MeshError(ValueError):
    """A mesh description that cannot be used; the message names the field."""


@dataclass(frozen=True)
class Mesh(HashOnce):
    shape: tuple[int, ...]
    axis_names: tuple[str, ...]
    links: tuple[Link, ...]
    hardware: Hardware

    def hash_key(self) -> tuple:
        return (self.shape, self.axis_names, self.links, self.hardware)

    __hash__ = HashOnce.__hash__  # dataclass(frozen=True) would otherwise generate one

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def crosses_nodes(self, axis: int) -> bool:
        return math.prod(self.shape[axis:]) > self.hardware.node_size

    def key(self) -> tuple:
        """Hashable identity for caches (shape, links, hardware figures)."""
        return (self.shape, self.links, self.hardware)

    def __str__(self) -> str:
        axes = ", ".join(f"{n}={s}" for n, s in zip(self.axis_names, self.shape, strict=False))
        return f"mesh({axes}; {self.hardware.name})"


def make_mesh(
    shape: Sequence[int] | str,
    axis_names: Sequence[str] | str | None = None,
    hardware: str | Hardware = "h100",
) -> Mesh:
    """A mesh from a shape (``(2, 4)`` or ``"2x4"``), optional axis names and a hardware preset or file."""
    dims = parse_mesh_shape(shape) if isinstance(shape, str) else tuple(int(s) for s in shape)
    if not dims or any(s < 1 for s in dims):
        raise MeshError(f"mesh: every axis size must be a positive integer, got {shape!r}")
    if axis_names is None:
        names = default_axis_names(len(dims))
    else:
        names = (
            tuple(n.strip() for n in axis_names.split(","))
            if isinstance(axis_names, str)
            else tuple(axis_names)
        )
    if len(names) != len(dims):
        raise MeshError(f"axis_names: {len(names)} names for a {len(dims)}-D mesh")
    if len(set(names)) != len(names) or any(not n for n in names):
        raise MeshError(f"axis_names: names must be distinct and non-empty, got {list(names)}")
    hw = get_hardware(hardware)
    links = tuple(axis_link(dims, axis, hw) for axis in range(len(dims)))
    return Mesh(shape=dims, axis_names=names, links=links, hardware=hw)


def axis_link(dims: tuple[int, ...], axis: int, hardware: Hardware) -> Link:
    """The link one axis's collectives run over, as a single ring's bandwidth and per-hop latency.

    Inside a node: ``intra_node``. Across nodes, a group of ``n`` devices holds ``g`` devices in each of
    ``m = n / g`` nodes (``g`` is 1 when the axes inside this one fill a node). Each device has its own
    NIC, so the ``g`` devices of a node move the node's share across nodes in parallel (NCCL runs one ring
    per NIC), while the rest of the pass runs over NVLink: a ring pass of ``S`` bytes per device takes
    ``max((n-1)/n * S / B_intra, (m-1)/m * S / (g * B_inter))``, and this link's bandwidth is the one that
    gives that time in the ring formula ``(n-1)/n * S / B``. Of the ring's ``n`` hops, ``m`` cross nodes:
    the latency is their mean."""
    n = dims[axis]
    stride = math.prod(dims[axis + 1 :])
    if n * stride <= hardware.node_size:
        return hardware.intra_node
    per_node = min(n, max(1, hardware.node_size // stride))
    if per_node == 1:
        return hardware.inter_node
    nodes = -(-n // per_node)
    intra, inter = hardware.intra_node, hardware.inter_node
    seconds_per_byte = max((n - 1) / n / intra.bandwidth, (nodes - 1) / nodes / (per_node * inter.bandwidth))
    latency = ((n - nodes) * intra.latency + nodes * inter.latency) / n
    return Link(bandwidth=(n - 1) / n / seconds_per_byte, latency=latency)


def parse_mesh_shape(text: str) -> tuple[int, ...]:
    """``"2x4"`` -> ``(2, 4)``; ``"64"`` -> ``(64,)``."""
    if not re.fullmatch(r"\s*\d+(\s*[x,]\s*\d+)*\s*", text):
        raise MeshError(f"mesh: expected sizes joined by 'x' such as 2x4, got {text!r}")
    return tuple(int(p) for p in re.split(r"[x,]", text.replace(" ", "")))


def default_axis_names(ndim: int) -> tuple[str, ...]:
    return {1: ("dp",), 2: ("dp", "tp"), 3: ("dp", "cp", "tp")}.get(
        ndim, tuple(f"axis{i}" for i in range(ndim))
    )
