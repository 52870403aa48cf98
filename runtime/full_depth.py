"""A plan made from a short capture, applied to the full depth of the model.

Deep built-in models are planned from ``captured`` layers standing for ``total``
(:mod:`strategies.problem.layer_repeat`): the plan names the op nodes of the short graph. Every layer of the
real model runs with the placements of the captured layer that stands for it (``LayerRepeat.captured_name``
on its module path): an op of the full graph is the op of the short graph with the same *key*

    (module path, mapped to the captured layer;  op;  forward or backward;  its index among the ops of that
     op and phase in its own module, in execution order)

so the third ``mm`` of layer 17's attention in the backward takes the placements of the third ``mm`` of the
middle copy's attention in the backward. :func:`expand_plan` rewrites the plan's nodes (and the values it
recomputes) under the full graph's names; the rest of the runtime then applies it like any plan.
"""

from __future__ import annotations

import operator
from collections import Counter
from collections.abc import Mapping
from typing import Any

from torch import fx

from runtime.plan_checks import PlanMismatch
from strategies.graph.capture import JointGraph
from strategies.problem.layer_repeat import LayerRepeat
from strategies.problem.layer_sharing import LAYER

Key = tuple[str | None, str, bool, int]


def node_keys(graph: JointGraph, repeat: LayerRepeat | None) -> list[tuple[Key, str]]:
    """(key, name) of each op node; ``repeat`` maps full-stack layers to captured ones (None: as is)."""
    seen: Counter[tuple[str | None, str, bool]] = Counter()
    keys = []
    for index, node in enumerate(graph.order):
        if node.target is operator.getitem:
            continue
        path = _layer_path(graph, node)
        backward = index >= graph.backward_start
        own = (path, str(node.target), backward)
        ordinal = seen[own]
        seen[own] += 1
        mapped = path if path is None or repeat is None else repeat.captured_name(path)
        keys.append(((mapped, str(node.target), backward, ordinal), node.name))
    return keys


def _layer_path(graph: JointGraph, node: fx.Node) -> str | None:
    """The node's module path; for an op outside every layer that reads a layer's output (the residual
    stream's gradient sums, between layers), that input's path marked as reached from outside: such ops
    repeat with the layers, so they belong to one."""
    path = graph.module_path.get(node.name)
    if path is not None and LAYER.search(path):
        return path
    for arg in node.all_input_nodes:
        source = graph.module_path.get(arg.name)
        if source is not None and LAYER.search(source):
            return f"{source}.<-{path or ''}"
    return path


def expand_plan(plan: Mapping[str, Any], short: JointGraph, full: JointGraph) -> dict[str, Any]:
    """``plan`` (made on ``short``, a capture of ``plan["layers"]["captured"]`` layers) with a node entry for
    every op of ``full`` (all ``total`` layers), and without ``layers``: a plan of the full graph."""
    layers = plan["layers"]
    repeat = LayerRepeat(int(layers["captured"]), int(layers["total"]))
    entries = {entry["name"]: entry for entry in plan["nodes"]}
    short_keys = dict(node_keys(short, None))
    nodes = []
    recomputed = set(plan.get("recompute") or ())
    recompute = []
    for key, name in node_keys(full, repeat):
        source = short_keys.get(key)
        if source is None or source not in entries:
            path, op, backward, ordinal = key
            raise PlanMismatch(
                f"model: op {name} ({op} #{ordinal} in the {'backward' if backward else 'forward'} of "
                f"{path or 'the step'}) has no counterpart in the plan's {repeat.captured}-layer capture"
            )
        nodes.append({**entries[source], "name": name})
        if source in recomputed:  # every layer recomputes what the layer standing for it does
            recompute.append(name)
    expanded = {key: value for key, value in plan.items() if key != "layers"}
    expanded["nodes"] = nodes
    if "recompute" in plan:
        expanded["recompute"] = recompute
    return expanded
