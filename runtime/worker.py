"""One rank of `autoshard run`: build the model, apply the plan, train, check against one process, report.

Every rank builds the same model from the same seed (:func:`runtime.run_setup.build_run_model`; with
``meta_init`` or ``weights`` each rank makes only its own shards), captures its training step exactly as the
planner did, and runs it with :class:`~runtime.planned_step.PlannedStep`. With ``check`` the same steps run
on one process (:mod:`runtime.one_process`: beside each rank, or in a process of its own for a sharded
build) and the loss and every gradient of step 0, then every parameter after the last step, are compared
within a tolerance fit for the dtype.
DTensor's ``CommDebugMode`` counts the collectives of each step; the report puts them beside the plan's.
Step ``k`` draws its random numbers (dropout) from ``torch.manual_seed(seed + k)``, the planned step and the
one-process reference alike, so their masks are the same (:mod:`runtime.random_ops`).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import statistics
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

from runtime import checkpoint, random_ops
from runtime.apply import apply_plan, compute_dtype_of
from runtime.collectives import COLLECTIVE_NAMES, CountCollectives
from runtime.one_process import FileReference, Reference, computed_in, file_reference, microbatches_of
from runtime.pipeline_step import PipelineStep
from runtime.plan_checks import check_plan, run_mesh
from runtime.planned_step import LiveBytes
from runtime.run_setup import RunOptions, build_run_model, check_world, load_plan, make_optimizer


def run_rank(options: RunOptions) -> dict[str, Any]:
    """Everything one rank does (the process group is up); the report (the same on every rank)."""
    plan = load_plan(options.plan)
    check_plan(plan)
    check_world(plan, dist.get_world_size())
    mesh = device_mesh(options.device, *run_mesh(plan))
    spec, applied, reference = _build_and_apply(options, plan, mesh)
    try:
        return _train(options, plan, spec, applied, reference)
    except BaseException:
        if isinstance(reference, FileReference) and dist.get_rank() == 0:
            reference.remove()  # a failed run leaves no copy of the whole model behind
        raise


def _train(
    options: RunOptions,
    plan: dict[str, Any],
    spec: Any,
    applied: Any,
    reference: Reference | FileReference | None,
) -> dict[str, Any]:
    """The steps, the check and the report of one rank."""
    from torch.distributed.tensor.debug import CommDebugMode

    from strategies.graph.capture import input_tensors

    drawn = random_ops.random_ops(applied.step.graph.order)
    if reference is not None:
        reference.random_ops = drawn
    inputs = input_tensors(spec.example_inputs)
    parameters = applied.parameters
    optimizer = make_optimizer(options.optimizer, parameters.values(), options.lr)
    if isinstance(reference, Reference):
        reference.optimizer = make_optimizer(options.optimizer, reference.module.parameters(), options.lr)
    if options.load:
        checkpoint.load(spec.module, optimizer, options.load)
        if reference is not None:
            reference.take(parameters, optimizer)
    losses: list[float] = []
    seconds: list[float] = []
    measured: dict[str, int] = {}
    measured_bytes = 0
    deviations: list[dict[str, Any]] = []
    peak = 0
    for index in range(options.steps):
        optimizer.zero_grad(set_to_none=True)
        held = _state_bytes(optimizer)
        random_ops.seed_step(options.seed, index)  # dropout's masks: the same draws on every rank
        started = time.perf_counter()
        with CommDebugMode() as comm, CountCollectives() as sizes:
            result = applied.forward_backward(inputs)
        optimizer.step()
        seconds.append(time.perf_counter() - started)
        peak = max(peak, result.peak_bytes + held, _step_bytes(parameters, optimizer))
        if index == 0:
            measured, measured_bytes = _collective_counts(comm), sum(sizes.nbytes.values())
            deviations = [dataclasses.asdict(d) for d in result.deviations]
        losses.append(float(result.loss.full_tensor()))
        if dist.get_rank() == 0:  # progress, as it goes
            print(f"step {index}: loss {losses[-1]:.6g} ({seconds[-1]:.3f} s)", file=sys.stderr, flush=True)
        if reference is not None:
            random_ops.seed_step(options.seed, index)  # the draws the planned step made
            reference.step(result if index == 0 else None)
    if options.save:
        checkpoint.save(spec.module, optimizer, options.save)
    if reference is not None:
        reference.compare_parameters(parameters, options)
        if isinstance(reference, FileReference):
            dist.barrier()  # every rank has read the file
            if dist.get_rank() == 0:
                reference.remove()
    predicted = plan.get("predicted", {}).get("collectives", {})
    predicted_bytes = plan.get("predicted", {}).get("comm_bytes")
    expected: dict[str, int] | None = expected_collectives(predicted, options.backend)
    if plan.get("pipeline"):  # this rank's: its stages' (the plan's whole is each device's average)
        stages = applied.step.predicted_collectives(plan)
        predicted, predicted_bytes = stages if stages is not None else ({}, None)
        expected = expected_collectives(predicted, options.backend) if stages is not None else None
    collectives = {
        "measured": measured,
        "predicted": predicted,
        "expected_on_backend": expected,
        "match": None if expected is None else measured == expected,
        "measured_bytes": measured_bytes,
        "predicted_bytes": predicted_bytes,
    }
    return {
        "model": options.model,
        "mesh": plan["mesh"],
        "world_size": dist.get_world_size(),
        "backend": options.backend,
        "steps": options.steps,
        "optimizer": options.optimizer,
        "loss": losses,
        "step_time_s": statistics.median(seconds[1:] or seconds),
        "step_times_s": seconds,
        "collectives": collectives,
        "deviations": deviations,
        "random_ops": {"ops": drawn, "path": random_ops.PATH if drawn else None},
        "recompute": {  # what the plan recomputes, and the ops made again for it
            "values": len(applied.step.recomputed),
            "ops_made_again": sum(entry.again for entry in applied.step.entries),
        },
        "memory": _memory(peak, plan),
        "checked": options.check,
        **({"pipeline": _pipeline_report(applied.step, plan, collectives)} if plan.get("pipeline") else {}),
    }


def _pipeline_report(step: PipelineStep, plan: dict[str, Any], collectives: dict[str, Any]) -> dict[str, Any]:
    """Per rank of the last step: the stages it ran, the seconds of their forwards and backwards (a
    zero-bubble schedule's ``B`` and ``W`` apart), its idle time (the step less them: its bubble, with the
    sends' waits), the bytes it sent point to point, the collectives of the first step (its ``collectives``
    as the report has them); beside the plan's."""
    measured = step.measured
    stages, microbatches = plan["pipeline"]["stages"], plan["pipeline"]["microbatches"]
    mine = {
        "stages": step.own,
        "forward_s": [measured.forward_s.get(s, 0.0) for s in step.own],
        "backward_s": [measured.backward_s.get(s, 0.0) for s in step.own],
        "weight_s": [measured.weight_s.get(s, 0.0) for s in step.own],
        "predicted_s": [  # the plan's seconds of each of its stages over the step's micro-batches
            sum(stages[s].get(kind, 0.0) for kind in ("forward_s", "backward_s", "weight_s")) * microbatches
            for s in step.own
        ],
        "step_s": measured.step_s,
        "idle_s": measured.step_s
        - sum(measured.forward_s.values())
        - sum(measured.backward_s.values())
        - sum(measured.weight_s.values()),
        "sent_bytes": measured.sent_bytes,
        "predicted_sent_bytes": step.predicted_sent_bytes(plan),
        "collectives": collectives["measured"],
        "predicted_collectives": collectives["expected_on_backend"],
        "collective_bytes": collectives["measured_bytes"],
        "predicted_collective_bytes": collectives["predicted_bytes"],
        "predicted_peak_bytes": max(plan["pipeline"]["stages"][s]["peak_memory_bytes"] for s in step.own),
    }
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    pipeline = plan["pipeline"]
    return {
        "schedule": pipeline["schedule"],
        "microbatches": pipeline["microbatches"],
        "chunks": pipeline.get("chunks", 1),
        "stages": [stage["layers"] for stage in pipeline["stages"]],
        "predicted_bubble_s": [stage["bubble_s"] for stage in pipeline["stages"]],
        "ranks": everyone,
        "torch_schedule": step.torch_stages.schedule_name if step.torch_stages is not None else None,
        "own_loop_because": step.own_loop_because,
        "sent_bytes_match": all(r["sent_bytes"] == r["predicted_sent_bytes"] for r in everyone),
        "collectives_match": None
        if collectives["expected_on_backend"] is None
        else all(r["collectives"] == r["predicted_collectives"] for r in everyone),
    }


def _state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """This rank's bytes of optimizer state (Adam's moments; nothing for plain SGD)."""
    live = LiveBytes()
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                live.add(value)
    return live.now


def _step_bytes(parameters: dict[str, torch.nn.Parameter], optimizer: torch.optim.Optimizer) -> int:
    """Bytes held at the optimizer step: parameters, gradients and optimizer state."""
    live = LiveBytes()
    for parameter in parameters.values():
        live.add(parameter)
        if parameter.grad is not None:
            live.add(parameter.grad)
    return live.now + _state_bytes(optimizer)


def _memory(peak: int, plan: dict[str, Any]) -> dict[str, Any]:
    """Every rank's measured peak of live tensors beside the plan's predicted peak per device, and every
    rank's largest resident set (the whole process: Python, torch, buffers, transients) since it started."""
    import resource

    peaks: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(peaks, peak)
    resident: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(resident, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)  # KiB
    predicted = plan.get("predicted", {}).get("peak_memory_bytes")
    return {
        "peak_bytes_per_rank": peaks,
        "max_rss_bytes_per_rank": resident,
        "predicted_peak_bytes": predicted,
        "largest_over_predicted": max(peaks) / predicted if predicted else None,
    }


def _collective_counts(comm: Any) -> dict[str, int]:
    """CommDebugMode's counts under the names plans use."""
    counts: dict[str, int] = {}
    for op, count in comm.get_comm_counts().items():
        name = next((part for part in str(op).split(".") if part in COLLECTIVE_NAMES), str(op))
        key = COLLECTIVE_NAMES.get(name, name)
        counts[key] = counts.get(key, 0) + int(count)
    return counts


@functools.cache
def device_mesh(device: str, shape: tuple[int, ...], axis_names: tuple[str, ...] | None = None) -> Any:
    """The device mesh of this layout (its axes unnamed without ``axis_names``), made once per process: each
    axis is a process group that is never freed (DTensor's caches keep meshes by value, so destroying one
    breaks the next run), and a process that runs plan after plan would otherwise gather idle groups and
    their threads."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device, shape, mesh_dim_names=axis_names)


def _build_and_apply(
    options: RunOptions, plan: dict[str, Any], mesh: Any
) -> tuple[Any, Any, Reference | FileReference | None]:
    """The model built from the seed with the plan's shapes (every rank alike), the one-process run a check
    compares with, and the plan applied to the model. A sharded build (``meta_init``, ``weights``) never
    holds the model whole: each rank makes its own shards, from the same seed as the one-process model
    (:mod:`runtime.parameter_shards`), and the one-process run is a process of its own
    (:func:`~runtime.one_process.file_reference`), run before any rank builds anything."""
    computing = compute_dtype_of(plan)
    compared = file_reference(options) if options.check and options.sharded_build else None
    spec, short = build_run_model(options, plan)
    reference: Reference | FileReference | None = None
    if compared is not None:
        reference = FileReference(compared, computing or computed_in(spec.module))
    elif options.check:
        reference = Reference(copy.deepcopy(spec.module), spec, computing, microbatches=microbatches_of(plan))
    # a sharded build draws its parameters now, from where the whole build drew them: right after the inputs
    applied = apply_plan(
        spec.module, plan, mesh, spec.example_inputs, spec.loss_fn, short_graph=short, weights=options.weights
    )
    return spec, applied, reference


def expected_collectives(predicted: dict[str, int], backend: str) -> dict[str, int]:
    """The collectives DTensor runs for the plan's on ``backend``: gloo has no all-to-all, and DTensor
    moves a shard between dims there by an all-gather."""
    expected = {name: count for name, count in predicted.items() if count}
    if backend == "gloo" and "all_to_all" in expected:
        expected["all_gather"] = expected.get("all_gather", 0) + expected.pop("all_to_all")
    return expected
