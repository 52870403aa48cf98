"""A plan applied to a module: its parameters made DTensors in their planned placements, and its step.

:func:`apply_plan` captures the module's training step as the planner did, refuses a plan made for another
model or mesh, makes every parameter a DTensor in its planned placements (so the module's state dict is the
sharded one) and returns an :class:`AppliedPlan` whose ``forward_backward`` runs one planned step
(:class:`runtime.planned_step.PlannedStep`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.distributed.device_mesh import DeviceMesh

from runtime.full_depth import expand_plan
from runtime.parameter_shards import Initialiser, place_parameters
from runtime.pipeline_step import PipelineStep
from runtime.plan_checks import PlanMismatch, check_plan
from runtime.planned_step import PlannedStep, StepResult
from strategies.graph.capture import JointGraph, first_rows, input_tensors


@dataclass
class AppliedPlan:
    """A module with a plan applied: its parameters as DTensors in their planned placements, and the step.

    ``forward_backward(inputs)`` runs one planned step on the inputs (global tensors every rank holds
    alike, each rank keeping its part; or, ``local=True``, each rank's own part), leaves each gradient in
    ``parameters[name].grad``, ready for any torch optimizer built over ``parameters.values()``, and returns
    the loss, gradients and deviations. A pipeline plan's step (:class:`runtime.pipeline_step.PipelineStep`)
    runs this rank's stages over the micro-batches; ``parameters`` are its stages' only. Random ops (dropout)
    draw from torch's default generator, which must be in the same state on every rank (seed them alike,
    e.g. ``runtime.random_ops.seed_step``): each rank keeps its piece of the same whole draw.
    """

    step: PlannedStep | PipelineStep
    parameters: dict[str, torch.nn.Parameter]
    buffers: dict[str, torch.Tensor]

    def forward_backward(self, inputs: Any, local: bool = False) -> StepResult:
        """One planned step on ``inputs`` (structured as the example inputs: a tuple, a dict of keyword
        arguments or a tensor): global tensors every rank holds alike, or, with ``local``, this rank's parts
        of them as a data loader gives them (:meth:`input_slices` says which)."""
        tensors = input_tensors(inputs)
        placed = self.step.assemble_inputs(tensors) if local else self.step.distribute_inputs(tensors)
        result = self.step(self.parameters, self.buffers, placed)
        for name, parameter in self.parameters.items():
            parameter.grad = result.gradients.get(name)
        return result

    def __call__(self, inputs: Any, local: bool = False) -> StepResult:
        """`forward_backward`: one planned step, the gradients left in ``.grad``."""
        return self.forward_backward(inputs, local)

    def input_slices(self) -> list[tuple[slice, ...]]:
        """Per input tensor (in the example inputs' order), the part of the global batch this rank loads:
        ``global_input[slices]``."""
        return self.step.input_slices()


def compute_dtype_of(plan: Mapping[str, Any]) -> torch.dtype | None:
    """The dtype a plan's step computes in where it is not its parameters' (mixed precision), else None."""
    from strategies.tensor_meta import parse_compute_dtype

    name = plan.get("request", {}).get("compute_dtype")
    return None if name is None else parse_compute_dtype(name)


def at_full_depth(
    plan: Mapping[str, Any], short_graph: JointGraph | None, graph: JointGraph
) -> Mapping[str, Any]:
    """``plan`` for the step captured as ``graph``: as it is, or, made from a short capture (``short_graph``,
    at the same batch), expanded to every layer (:mod:`runtime.full_depth`)."""
    if "layers" not in plan:
        return plan
    if short_graph is None:
        raise PlanMismatch(f"plan: made from a short capture (layers {plan['layers']}); pass short_graph")
    return expand_plan(plan, short_graph, graph)


def apply_plan(
    module: torch.nn.Module,
    plan: Mapping[str, Any],
    mesh: DeviceMesh,
    example_inputs: Any,
    loss_fn: Any = None,
    short_graph: JointGraph | None = None,
    init: Initialiser | None = None,
    weights: str | Path | None = None,
) -> AppliedPlan:
    """Apply ``plan`` to ``module`` on ``mesh``: capture its training step on ``example_inputs`` as the
    planner did (``loss_fn`` as for planning), refuse a plan made for another model or mesh
    (:class:`PlanMismatch`), and make every parameter of the module a DTensor in its planned placements
    (tied names share one), so the module's state dict is the sharded one. A mixed-precision plan
    (``request.compute_dtype``) computes on copies of the parameters in that dtype, as it was planned. A
    plan made from a short capture of a deep model needs that capture (``short_graph``; a pipeline's at its
    micro-batch size): every layer then runs as the layer standing for it (:mod:`runtime.full_depth`).

    A module built on the meta device (``autoshard.meta_init()``) is never made whole: each rank makes its
    own shards, initialised by ``init`` (one submodule at a time; default ``reset_parameters()``) from the
    current random state, or read from ``weights`` (a ``torch.distributed.checkpoint`` directory or
    safetensors files) (:mod:`runtime.parameter_shards`).

    A pipeline plan (``plan["pipeline"]``) runs on ``mesh`` with its ``pp`` axis first: the step is captured
    at the micro-batch size, and each rank places only the parameters of its stages, on its stage's mesh
    (:mod:`runtime.pipeline_step`); the others are left on the meta device."""
    from runtime.device_attention import register_for
    from strategies.graph.passes import capture_for_planning
    from strategies.ops.dtensor_bridge import register_with_dtensor

    register_with_dtensor()
    register_for(mesh.device_type)  # the CPU capture's attention kernels, on the mesh's device
    check_plan(plan, tuple(mesh.shape))
    if plan.get("pipeline"):
        micro = first_rows(example_inputs, plan["pipeline"]["microbatch_size"])
        graph = capture_for_planning(module, micro, loss_fn, compute_dtype_of(plan))
        pipeline = PipelineStep(graph, at_full_depth(plan, short_graph, graph), mesh)
        placed = place_parameters(
            module, graph, pipeline.parameter_placements, pipeline.stage_mesh, init, weights, only=True
        )
        return AppliedPlan(pipeline, placed, dict(module.named_buffers()))
    graph = capture_for_planning(module, example_inputs, loss_fn, compute_dtype_of(plan))
    step = PlannedStep(graph, at_full_depth(plan, short_graph, graph), mesh)
    parameters = place_parameters(module, graph, step.parameter_placements, mesh, init, weights)
    return AppliedPlan(step, parameters, dict(module.named_buffers()))
