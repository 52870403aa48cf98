"""A captured training step as a graph document the service can plan from without the model's code.

:func:`export_graph` is what a launcher calls on its own ``nn.Module``: it captures the step as the planner
does (:func:`~strategies.graph.passes.capture_for_planning`) and writes the graph after the planner's
passes, so a reader rebuilds, node for node, the graph the planner would have built the problem from. The
document (``docs/graph-format.md``) holds every node in execution order with its op, arguments and output
shapes, strides and dtypes, the roles of the nodes (parameters, buffers, inputs, loss, gradients), each op's
module path and, for a deep stack captured short, how many layers the capture stands for.
"""

from __future__ import annotations

import hashlib
import json
import operator
from typing import TYPE_CHECKING, Any

import torch
from torch import fx

from strategies.graph.graph_format import (
    ALLOWED_NAMESPACES,
    FORMAT,
    GETITEM,
    PASSES,
    VERSION,
    GraphExportError,
    encode_value,
)

if TYPE_CHECKING:
    from torch import nn

    from strategies.graph.capture import JointGraph, LossFn
    from strategies.problem.layer_repeat import LayerRepeat


def export_graph(
    module: nn.Module,
    inputs: Any,
    loss_fn: LossFn | None = None,
    *,
    total_layers: int | None = None,
    model: str | None = None,
    compute_dtype: torch.dtype | None = None,
) -> dict[str, Any]:
    """The graph document of one training step of ``module`` on ``inputs`` (global shapes), as JSON data.

    ``inputs`` and ``loss_fn`` are as for :func:`~strategies.graph.capture.capture_step`; the module may
    live on the meta device. ``total_layers``: the module holds a few identical blocks (``layers.0`` …,
    at least 4: first, middle copies, last) standing for a stack of this many; the planner then plans the
    whole stack from the short capture (:mod:`strategies.problem.layer_repeat`). ``model`` is a label kept
    in the document; ``compute_dtype``: mixed precision (the step computes on copies of the parameters in
    that dtype, the casts in the graph). Raises :class:`~strategies.graph.graph_format.GraphExportError`
    when the graph holds something the format cannot write, ValueError when the middle layers are not
    identical.
    """
    from strategies.graph.passes import capture_for_planning

    graph = capture_for_planning(module, inputs, loss_fn, compute_dtype)
    repeat = None
    if total_layers is not None:
        repeat = declared_repeat(graph, total_layers)
    return graph_document(graph, repeat=repeat, model=model or type(module).__name__)


def declared_repeat(graph: JointGraph, total_layers: int) -> LayerRepeat | None:
    """The layer repeat of a capture holding some of ``total_layers`` identical layers (None when it holds
    them all); refused unless its middle layers are identical, as the planner would find them."""
    from strategies.problem.builder import tied_middle_layers
    from strategies.problem.layer_repeat import LayerRepeat
    from strategies.problem.layer_sharing import layer_of

    captured = len({layer_of(path) for path in graph.module_path.values()} - {None})
    if total_layers <= captured:
        return None
    repeat = LayerRepeat(captured, total_layers)
    tied = tied_middle_layers(graph.gm, graph.module_path)
    if len(tied) != captured - 2:
        raise ValueError(
            f"total_layers: the {captured - 2} middle layers of the capture are not identical "
            f"(tied: {tied}), so they cannot stand for {total_layers} layers; export every layer"
        )
    return repeat


def graph_document(graph: JointGraph, repeat: LayerRepeat | None = None, model: str = "") -> dict[str, Any]:
    """The document of a graph the planner's passes have rewritten (``capture_for_planning``)."""
    output = graph.gm.graph.output_node().args[0]
    expected = [graph.loss, *graph.gradients.values(), *graph.input_gradients.values()]
    if list(output) != expected:
        raise GraphExportError("outputs: the graph's outputs are not (loss, *gradients) of its roles")
    constants = [name for name in graph.buffers if name in graph.constants]
    return {
        "format": FORMAT,
        "version": VERSION,
        "model": model,
        "producer": {"torch": torch.__version__.split("+")[0]},
        "passes": list(PASSES),
        "nodes": [_node(node, graph.module_path) for node in graph.gm.graph.nodes if node.op != "output"],
        "parameters": {name: node.name for name, node in graph.parameters.items()},
        "tied": {name: list(others) for name, others in graph.tied.items()},
        "buffers": {name: node.name for name, node in graph.buffers.items()},
        "constants": constants,
        "inputs": [node.name for node in graph.inputs],
        "loss": graph.loss.name,
        "gradients": {name: node.name for name, node in graph.gradients.items()},
        "input_gradients": {str(i): node.name for i, node in graph.input_gradients.items()},
        "layers": None if repeat is None else {"captured": repeat.captured, "total": repeat.total},
    }


def op_name(target: Any) -> str:
    """The document's name of an op: ``aten.mm.default``, or ``operator.getitem``."""
    if target is operator.getitem:
        return GETITEM
    if isinstance(target, torch._ops.OpOverload) and target.namespace in ALLOWED_NAMESPACES:
        return str(target)
    raise GraphExportError(
        f"op: {target} is not an overload of torch.ops.{{{','.join(ALLOWED_NAMESPACES)}}}; "
        "version 1 of the graph format holds only those"
    )


def _node(node: fx.Node, module_path: dict[str, str]) -> dict[str, Any]:
    where = f"nodes[{node.name}]"
    if node.op == "placeholder":
        return {
            "name": node.name,
            "op": "placeholder",
            "val": encode_value(node.meta.get("val"), _no_node, where),
        }
    if node.op != "call_function":
        raise GraphExportError(
            f"{where}: a {node.op} node has no place in the graph format (only placeholders and op calls)"
        )
    try:
        op = op_name(node.target)
    except GraphExportError as error:
        raise GraphExportError(f"{where}.{error}") from None
    record = {
        "name": node.name,
        "op": op,
        "args": encode_value(list(node.args), _fx_name, f"{where}.args"),
        "kwargs": {k: encode_value(v, _fx_name, f"{where}.kwargs.{k}") for k, v in node.kwargs.items()},
        "val": encode_value(node.meta.get("val"), _no_node, f"{where}.val"),
    }
    if node.name in module_path:
        record["module"] = module_path[node.name]
    return record


def _no_node(value: Any) -> None:
    return None


def _fx_name(value: Any) -> str | None:
    return value.name if isinstance(value, fx.Node) else None


def graph_json(document: dict[str, Any]) -> str:
    """The document as compact JSON text (no NaN or Infinity literals: they are tagged)."""
    return json.dumps(document, separators=(",", ":"), allow_nan=False)


def graph_digest(document: dict[str, Any]) -> str:
    """SHA-256 of the document's canonical JSON (sorted keys): one key per graph for a plan cache."""
    canonical = json.dumps(document, separators=(",", ":"), sort_keys=True, allow_nan=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


__all__ = ["declared_repeat", "export_graph", "graph_digest", "graph_document", "graph_json", "op_name"]
