"""New op nodes for the graph rewrites (:mod:`strategies.graph.passes`, :mod:`strategies.graph.experts`):
each carries its fake value, computed as the capture computed every other, and the provenance of the node
it stands for, so module paths, layers and stack traces read as before the rewrite."""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import Graph, Node

PROVENANCE_KEYS = (
    "stack_trace",
    "nn_module_stack",
    "source_fn_stack",
    "torch_fn",
    "seq_nr",
    "autograd_backward",
    "partitioner_tag",
)
"""Node meta copied from the node a new one stands for (where it came from)."""


def new_call(graph: Graph, target: Any, args: tuple, like: Node) -> Node:
    """A new ``call_function`` node with ``meta["val"]`` (from fake execution) and ``like``'s provenance."""
    from torch.fx.passes.shape_prop import _extract_tensor_metadata

    node = graph.create_node("call_function", target, args, name=target.overloadpacket.__name__)
    node.meta["val"] = _fake_run(target, args)
    if isinstance(node.meta["val"], torch.Tensor):
        node.meta["tensor_meta"] = _extract_tensor_metadata(node.meta["val"])
    for key in PROVENANCE_KEYS:
        if key in like.meta:
            node.meta[key] = like.meta[key]
    return node


def _fake_run(target: Any, args: tuple) -> torch.Tensor:
    """``target(*args)`` on the fake values of the argument nodes, in their fake mode."""
    from torch._guards import detect_fake_mode

    values = torch.fx.node.map_arg(args, lambda n: n.meta["val"])
    mode = detect_fake_mode(torch.utils._pytree.tree_leaves(values))
    if mode is None:
        raise ValueError(f"graph_passes: the arguments of {target} carry no fake tensor values")
    with mode, torch.no_grad():
        return target(*values)


__all__ = ["PROVENANCE_KEYS", "new_call"]
