"""The library's calls: :func:`plan` a module (or an exported graph) on a mesh, :func:`apply` the
:class:`Plan` to the module, :func:`export_graph` for a planner elsewhere (the service, ``autoshard plan
--graph``), :func:`load_plan` / :meth:`Plan.save` to keep one.

Inside ``torchrun`` every rank calls :func:`plan` alike; only rank 0 captures and solves (a solver under a
time limit need not answer the same twice), and every rank gets its plan, or the error it raised.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from runtime.apply import AppliedPlan, apply_plan
from runtime.plan_checks import check_plan
from strategies.graph import export

MeshLike = DeviceMesh | str | Sequence[int]
"""A ``DeviceMesh``, or a mesh's shape (``"2x4"``, ``(2, 4)``) to plan for one not made yet."""


@dataclass(frozen=True)
class Plan:
    """A plan: for every parameter, input and op of one training step, its placement on each mesh axis,
    and what the plan predicts (``document`` is the plan JSON, the format `autoshard plan` writes)."""

    document: dict[str, Any]

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        return tuple(self.document["mesh"]["shape"])

    @property
    def axis_names(self) -> tuple[str, ...]:
        return tuple(self.document["mesh"]["axis_names"])

    @property
    def step_time_s(self) -> float:
        """Predicted seconds per training step."""
        return float(self.document["predicted"]["step_time_s"])

    @property
    def peak_memory_bytes(self) -> int:
        """Predicted peak bytes per device."""
        return int(self.document["predicted"]["peak_memory_bytes"])

    @property
    def parameters(self) -> dict[str, list[str]]:
        """Parameter name -> its placement per mesh axis (``["S(0)", "R"]``)."""
        return dict(self.document["parameters"])

    @property
    def recompute(self) -> list[str]:
        """The ops whose outputs the backward makes again."""
        return list(self.document.get("recompute", []))

    def input_slices(self, rank: int, example_inputs: Any) -> list[Any]:
        """Per input tensor of the step (the tensors of ``example_inputs``, global shapes, in order), the part
        rank ``rank`` loads: ``global_input[slices]`` (ranks laid out on the mesh in row-major order, as
        ``init_device_mesh`` lays them out). A data loader gives each rank that part; the applied step takes
        it with ``local=True``. A pipeline plan's: per input, the rank's part of each micro-batch, a list of
        slices (``torch.cat([x[s] for s in slices])`` is its part; the applied step's ``input_slices()``
        leaves out the inputs its stages do not read)."""
        from runtime.local_inputs import input_slices, mesh_coordinate, microbatch_slices
        from runtime.plan_checks import input_placements
        from strategies.graph.capture import input_tensors

        shapes = [tuple(tensor.shape) for tensor in input_tensors(example_inputs)]
        placements = input_placements(self.document, len(shapes))
        coordinate = mesh_coordinate(rank, self.mesh_shape)
        pipeline = self.document.get("pipeline")
        if pipeline is None:
            return input_slices(placements, shapes, self.mesh_shape, coordinate)
        m, rows = pipeline["microbatches"], pipeline["microbatch_size"]
        stage_shape = tuple(pipeline["stage_mesh"]["shape"])
        stage_coordinate = coordinate[1:] if len(self.mesh_shape) > 1 else [0]
        one = [(rows, *shape[1:]) for shape in shapes]  # one micro-batch's
        return [
            microbatch_slices(part, m, rows)
            for part in input_slices(placements, one, stage_shape, stage_coordinate)
        ]

    def summary(self) -> str:
        """What `autoshard plan` prints: placements by layer, step time, memory against the budget."""
        from service.plan_view import summary

        return summary(self.document)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.document, indent=1), encoding="utf-8")


def load_plan(path: str | Path) -> Plan:
    """The plan JSON at ``path``; ValueError (:class:`~runtime.plan_checks.PlanMismatch`) for a version this
    library cannot apply."""
    document = json.loads(Path(path).read_text(encoding="utf-8"))
    check_plan(document)
    return Plan(document)


def export_graph(
    module: nn.Module,
    example_inputs: Any,
    loss_fn: Callable[..., torch.Tensor] | None = None,
    compute_dtype: str | None = None,
) -> dict[str, Any]:
    """The graph document of one training step of ``module`` on ``example_inputs`` (global shapes; the module
    may live on the meta device), for a planner elsewhere (``docs/graph-format.md``). ``loss_fn(output)``
    makes the loss from the module's output; without it the output must be the loss, or carry ``.loss``.
    ``compute_dtype`` (mixed precision): the step computes on copies of the parameters in that dtype (plan
    the document with the same ``compute_dtype``)."""
    from strategies.tensor_meta import parse_compute_dtype

    dtype = None if compute_dtype is None else parse_compute_dtype(compute_dtype)
    return export.export_graph(module, example_inputs, loss_fn, compute_dtype=dtype)


def plan(
    model: nn.Module | Mapping[str, Any],
    example_inputs: Any,
    mesh: MeshLike,
    *,
    loss_fn: Callable[..., torch.Tensor] | None = None,
    axis_names: Sequence[str] | None = None,
    memory_gib: float | None = None,
    hardware: str = "h100",
    recompute: str = "auto",
    baseline: str | None = None,
    compute_dtype: str | None = None,
    time_limit: float = 60.0,
    gap: float | None = None,
    progress: Callable[[str], None] | None = None,
) -> Plan:
    """Plan one training step of ``model`` (a module, or a graph document :func:`export_graph` wrote, then
    ``example_inputs`` is unused) on ``mesh``.

    ``memory_gib``: the budget per device (default: the hardware's capacity); ``hardware``: a preset
    (``h100``, ``h200``, ``a100``, ``b200``, ``cpu``) or a JSON/YAML file; ``recompute``: ``auto``, ``none``,
    ``selective`` or ``full``; ``baseline``: a hand-written layout (``ddp``, ``fsdp``, ``megatron``,
    ``fsdp_tp``) whose placements are pinned; ``compute_dtype``: mixed precision (the parameters, their
    gradients and Adam's state stay in the module's dtype, the step computes on copies in this dtype, as
    FSDP2's ``MixedPrecisionPolicy`` does; ``apply`` runs it so). Raises
    :class:`~solver.errors.InfeasibleError` when no plan fits the budget (its message says the smallest peak
    any plan reaches), ValueError for bad input.

    With ``torch.distributed`` initialised and more than one rank, rank 0 plans and every rank returns its
    plan (or raises its error): call it on every rank.
    """
    shape, names = _mesh_fields(mesh, axis_names, hardware)
    fields = _request_fields(memory_gib, hardware, recompute, baseline, compute_dtype, time_limit, gap)

    def make() -> Plan:
        return _plan_here(model, example_inputs, shape, names, loss_fn, progress, fields)

    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    if not distributed or torch.distributed.get_world_size() == 1:
        return make()
    answer: list[Any] = [None]
    if torch.distributed.get_rank() == 0:
        try:
            answer[0] = make()
        except Exception as error:  # every rank raises what rank 0 met
            answer[0] = error
    torch.distributed.broadcast_object_list(answer, src=0)
    if isinstance(answer[0], Exception):
        raise answer[0]
    return answer[0]


def apply(
    module: nn.Module,
    plan: Plan | Mapping[str, Any],
    mesh: DeviceMesh,
    example_inputs: Any,
    loss_fn: Callable[..., torch.Tensor] | None = None,
    graph: Mapping[str, Any] | None = None,
    *,
    init: Callable[[nn.Module], None] | None = None,
    weights: str | Path | None = None,
) -> AppliedPlan:
    """Apply ``plan`` to ``module`` on ``mesh`` (a ``DeviceMesh`` of the plan's shape, on every rank): the
    module's parameters become DTensors in their planned placements (its ``parameters()`` and state dict
    are the sharded ones, for any torch optimizer and ``torch.distributed.checkpoint``), and the returned
    step, called with a batch of the example's shapes (global tensors every rank holds alike), runs one
    forward + backward as planned and leaves each gradient in its parameter's ``.grad``. Raises
    :class:`~runtime.plan_checks.PlanMismatch` for a plan made for another model or mesh. A plan made from
    the graph document of a short capture (a few layers standing for the stack, ``total_layers``) needs that
    ``graph``: every layer of the module then runs as the captured layer standing for it.

    A module built under :func:`meta_init` (its parameters on the meta device) is never made whole: each
    rank makes only its own shards, either by the module's own initialisation (``init(submodule)`` for each
    submodule, children first, as ``module.apply(init)`` visits them; default each submodule's
    ``reset_parameters()``), drawing from torch's random state as one process would (seed every rank alike
    first: the whole then equals that one-process model), or by reading only its own slices of ``weights``
    (a ``torch.distributed.checkpoint`` directory, a safetensors file, or a directory of safetensors files
    with a Hugging Face ``model.safetensors.index.json``)."""
    document = plan.document if isinstance(plan, Plan) else dict(plan)
    short = None
    if graph is not None:
        from strategies.graph.imported import load_graph

        short = load_graph(dict(graph)).graph
    return apply_plan(module, document, mesh, example_inputs, loss_fn, short, init, weights)


def _request_fields(
    memory_gib: float | None,
    hardware: str,
    recompute: str,
    baseline: str | None,
    compute_dtype: str | None,
    time_limit: float,
    gap: float | None,
) -> dict[str, Any]:
    """The request fields the caller set (``gap`` left to the planner's default when None)."""
    fields: dict[str, Any] = {
        "memory_gib": memory_gib,
        "hardware": hardware,
        "recompute": recompute,
        "baseline": baseline,
        "compute_dtype": compute_dtype,
        "time_limit": time_limit,
    }
    if gap is not None:
        fields["gap"] = gap
    return fields


def _plan_here(
    model: nn.Module | Mapping[str, Any],
    example_inputs: Any,
    shape: str,
    names: str | None,
    loss_fn: Callable[..., torch.Tensor] | None,
    progress: Callable[[str], None] | None,
    fields: dict[str, Any],
) -> Plan:
    from strategies.plan.planner import PlanRequest, plan_model

    document = (
        dict(model)
        if isinstance(model, Mapping)
        else export_graph(model, example_inputs, loss_fn, fields.get("compute_dtype"))
    )
    request = PlanRequest(model="", graph=document, mesh=shape, axis_names=names, **fields)
    return Plan(plan_model(request, progress).plan)


def _mesh_fields(mesh: MeshLike, axis_names: Sequence[str] | None, hardware: str) -> tuple[str, str | None]:
    """(the shape as ``"2x4"``, the axis names comma-separated or None for the defaults), checked by the
    planner's own rules (``make_mesh``) before anything is captured."""
    from strategies.cost.mesh import make_mesh

    if isinstance(mesh, DeviceMesh):
        mesh, axis_names = tuple(mesh.shape), axis_names or mesh.mesh_dim_names
    checked = make_mesh(mesh, axis_names, hardware)
    names = None if axis_names is None else ",".join(checked.axis_names)
    return "x".join(str(size) for size in checked.shape), names


__all__ = ["MeshLike", "Plan", "apply", "export_graph", "load_plan", "plan"]
