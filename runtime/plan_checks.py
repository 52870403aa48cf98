"""Whether a plan fits what it is applied to, and what it says per op node.

A plan (JSON version 1) names a mesh shape, every parameter's and input's placements, and per op node of the
captured step the placements of each tensor it reads and of each output. These checks refuse, before any
rank moves data, a plan of another version, mesh, model or parameter set, or one whose placements a tensor
cannot hold (:class:`PlanMismatch`, one line saying which); :func:`node_plans` reads the per-node placements
the executor (:mod:`runtime.planned_step`) applies.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from runtime.plan_specs import output_codes, read_placements, tensor_placements
from strategies.graph.capture import JointGraph
from strategies.placement import Spec
from strategies.plan.plan_json import PLAN_VERSION

Placements = tuple[Any, ...]


class PlanMismatch(ValueError):
    """The plan does not fit what it is applied to (another model, mesh, version); the message says how."""


@dataclass(frozen=True)
class NodePlan:
    """The placements a plan chose for one op node: per tensor argument (``None``: the op does not read it,
    any placement will do) and per output, as codes (``None``: not a tensor). :mod:`runtime.plan_specs` reads
    them."""

    inputs: tuple[Placements | None, ...]
    outputs: tuple[Spec | None, ...]


def check_plan(plan: Mapping[str, Any], mesh_shape: Sequence[int] | None = None) -> None:
    """Refuse a plan this runtime cannot apply: an unknown version, another mesh shape than ``mesh_shape``
    (a pipeline's: :func:`run_mesh`)."""
    version = plan.get("version")
    if version != PLAN_VERSION:
        raise PlanMismatch(f"plan: version {version!r} is not one this runtime knows ({PLAN_VERSION})")
    planned = run_mesh(plan)[0]
    if mesh_shape is not None and planned != tuple(mesh_shape):
        raise PlanMismatch(f"mesh: the plan is for a mesh of shape {list(planned)}, not {list(mesh_shape)}")


def run_mesh(plan: Mapping[str, Any]) -> tuple[tuple[int, ...], tuple[str, ...] | None]:
    """The shape and axis names of the device mesh a plan runs on: its mesh's, or for a pipeline the pp
    axis and its stages' mesh (a pp-only mesh runs its stages on one device each)."""
    mesh = plan.get("mesh", {})
    pipeline = plan.get("pipeline")
    if not pipeline:
        names = mesh.get("axis_names")
        return tuple(mesh.get("shape", ())), None if names is None else tuple(names)
    stages = pipeline["stage_mesh"]
    return (mesh["shape"][0], *stages["shape"]), (pipeline["axis"], *stages["axis_names"])


def placements_of(texts: Sequence[str] | None, where: str) -> Placements | None:
    """The DTensor placements of a parameter or input; a text no tensor can be placed in is the plan's
    fault, said as such (not as another model's)."""
    try:
        return None if texts is None else tensor_placements(texts)
    except ValueError as error:
        raise PlanMismatch(f"plan: {where}: {error}; plan again with this version") from None


def input_placements(plan: Mapping[str, Any], inputs: int) -> list[Placements | None]:
    """The plan's placements of the step's ``inputs`` tensor inputs, in order; refuses a plan placing
    another number of them."""
    planned = plan.get("inputs", [])
    if len(planned) != inputs:
        raise PlanMismatch(f"model: the plan places {len(planned)} inputs, the model takes {inputs}")
    return [placements_of(texts, f"input {k}") for k, texts in enumerate(planned)]


OTHER_MODEL = "model: the plan was made for another model"


def node_plans(plan: Mapping[str, Any], graph: JointGraph) -> dict[str, NodePlan]:
    """The plan's placements per op node of ``graph``; refuses a plan made for another model (an op node
    the plan does not name or names with another op, another parameter set)."""
    by_name = {entry["name"]: entry for entry in plan.get("nodes", [])}
    parameters = set(plan.get("parameters", {}))
    missing = sorted(set(graph.parameters) - parameters)
    extra = sorted(parameters - set(graph.parameters) - {n for names in graph.tied.values() for n in names})
    problems = [f"parameters it does not place: {', '.join(missing[:5])}"] if missing else []
    problems += [f"parameters the model does not have: {', '.join(extra[:5])}"] if extra else []
    if problems:
        raise PlanMismatch(f"{OTHER_MODEL}: {'; '.join(problems)}")
    plans = {}
    for node in graph.order:
        if node.target is operator.getitem:  # folded into its producer: consumers read output k
            continue
        entry = by_name.get(node.name)
        if entry is None:
            raise PlanMismatch(f"{OTHER_MODEL}: it has no op node {node.name!r}")
        if entry["op"] != str(node.target):
            raise PlanMismatch(
                f"{OTHER_MODEL}: node {node.name!r} is {entry['op']} in the plan, {node.target} here"
            )
        try:
            plans[node.name] = NodePlan(
                tuple(read_placements(spec) for spec in entry["inputs"]),
                tuple(output_codes(spec) for spec in entry["output"]),
            )
        except ValueError as error:
            raise PlanMismatch(f"plan: node {node.name} ({entry['op']}): {error}; plan again") from None
    if len(by_name) != len(plans):
        unknown = sorted(set(by_name) - set(plans))
        raise PlanMismatch(f"{OTHER_MODEL}: ops {', '.join(unknown[:5])} are not in it")
    return plans


def check_shapes(plan: Mapping[str, Any], graph: JointGraph) -> None:
    """Refuse a plan whose placements cannot hold the graph's tensors (a shard of a dim the tensor lacks)."""
    for name, node in graph.parameters.items():
        ndim = node.meta["val"].ndim
        for placement in placements_of(plan["parameters"][name], f"parameter {name}") or ():
            if placement.is_shard() and placement.dim >= ndim:
                raise PlanMismatch(
                    f"model: parameter {name} has {ndim} dims; the plan shards dim {placement.dim}"
                )


__all__ = [
    "OTHER_MODEL",
    "NodePlan",
    "Placements",
    "PlanMismatch",
    "check_plan",
    "check_shapes",
    "node_plans",
    "placements_of",
]
