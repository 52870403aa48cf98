"""Repeated layers share decisions: identical transformer blocks take the same strategies.

A node belongs to layer ``i`` when its module path has a ``layers.i`` component (backward ops carry the
path of their forward op, see :mod:`strategies.graph.capture`). Layers whose op sequences are identical (same
op, same argument and output shapes, position by position, forward and backward) are *tied*: the k-th op
of every tied layer joins one solver group, and so do their parameters (``layers.i.<rest>``). The first
and last layers stay free (``free_ends``), so an optimum may still treat the ends of the stack differently;
every layer keeps its own memory intervals, so the memory limit is still checked step by step.

With groups the solver's reductions fold all tied layers into one super node per position, so the
program grows by the free layers only, not with depth.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

LAYER_STACKS = ("layers", "layer", "h", "blocks")
"""The names a stack of numbered layers (an ``nn.ModuleList``) goes by: ``layers`` (Llama, Mistral, Qwen,
GPT-NeoX, most ``transformers`` decoders, the built-in models), ``layer`` (BERT's and ViT's
``encoder.layer``), ``h`` (GPT-2, Falcon, BLOOM: ``transformer.h``), ``blocks`` (MPT). Not T5's ``block``:
its encoder and decoder stacks both count from 0 and would be taken for one (as an encoder-decoder's two
``layers`` stacks are)."""
LAYER = re.compile(rf"(?:^|\.)(?:{'|'.join(LAYER_STACKS)})\.(\d+)(?:\.|$)")
"""A layer's part of a module path or parameter name; its group 1 is the layer's number."""


def layer_of(path: str) -> int | None:
    """The number of the layer a module path or parameter name lies in (:data:`LAYER`); None outside."""
    match = LAYER.search(path)
    return int(match.group(1)) if match else None


def tied_layer_groups(
    ops: Sequence[tuple[str, Any, int]],
    module_path: Mapping[str, str],
    parameters: Mapping[str, int],
    free_ends: int = 1,
) -> list[list[int]]:
    """Groups of problem-node indices to tie. ``ops`` lists ``(node name, signature, problem index)`` in
    execution order; ``parameters`` maps parameter names to problem indices."""
    per_layer = _ops_per_layer(ops, module_path)
    tied = tied_layers(ops, module_path, free_ends)
    if not tied:
        return []
    groups = [[per_layer[layer][k][1] for layer in tied] for k in range(len(per_layer[tied[0]]))]
    groups += _parameter_groups(parameters, set(tied))
    return groups


def tied_layers(
    ops: Sequence[tuple[str, Any, int]], module_path: Mapping[str, str], free_ends: int = 1
) -> list[int]:
    """The middle layers whose op sequences equal the first middle layer's (none if fewer than two)."""
    per_layer = _ops_per_layer(ops, module_path)
    layers = sorted(per_layer)
    middle = layers[free_ends : len(layers) - free_ends] if len(layers) > 2 * free_ends else []
    if len(middle) < 2:
        return []
    reference = [sig for sig, _ in per_layer[middle[0]]]
    tied = [layer for layer in middle if [sig for sig, _ in per_layer[layer]] == reference]
    return tied if len(tied) >= 2 else []


def _ops_per_layer(
    ops: Sequence[tuple[str, Any, int]], module_path: Mapping[str, str]
) -> dict[int, list[tuple[Any, int]]]:
    per_layer: dict[int, list[tuple[Any, int]]] = defaultdict(list)
    for name, signature, index in ops:
        layer = layer_of(module_path.get(name, ""))
        if layer is not None:
            per_layer[layer].append((signature, index))
    return per_layer


def _parameter_groups(parameters: Mapping[str, int], tied: set[int]) -> list[list[int]]:
    by_rest: dict[str, list[int]] = defaultdict(list)
    for name, index in parameters.items():
        match = LAYER.search(name)
        if match and int(match.group(1)) in tied:
            by_rest[name[: match.start(1)] + "*" + name[match.end(1) :]].append(index)
    return [members for members in by_rest.values() if len(members) > 1]


def merge_groups(groups: Iterable[Sequence[int]]) -> list[tuple[int, ...]]:
    """Disjoint groups from overlapping ones (union-find): a parameter tied across layers and to its
    gradient sink ends in one group with all of them."""
    parent: dict[int, int] = {}

    def find(x: int) -> int:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for group in groups:
        first = find(group[0])
        for member in group[1:]:
            parent[find(member)] = first
    members: dict[int, list[int]] = defaultdict(list)
    for x in parent:
        members[find(x)].append(x)
    return [tuple(sorted(m)) for m in members.values() if len(m) > 1]
