"""Plans with a pipeline axis: the model's layers cut into stages along ``pp``, each sharded on the rest.

A mesh whose first (outermost) axis is named ``pp`` is a pipeline: its ``p`` slices are the stages, each a
copy of the mesh of the other axes. Every stage runs the same placements there (identical layers share
decisions), so the integer program is solved once, for the whole model on the other axes at the size of one
micro-batch (``batch / m``), as any plan is; :mod:`strategies.plan.stages` then splits that plan's step by
layer and predicts the pipeline: the layers cut to balance the stages (the embedding on the first, the head
and the loss on the last), the send between neighbouring stages, the schedule's bubble, each stage's peak
memory.

The micro-batch count ``m`` and the schedule are chosen where the request leaves them open: ``m`` among
``p``, ``2p``, ``4p`` (those dividing the batch), each a plan of its own; the schedules ``1f1b``,
``zero-bubble`` (its backward split in two, the parameters' gradients filling the bubble) and
``interleaved-1f1b``, each with 1 (zero-bubble), 2 or 4 stages per rank, and ``gpipe``
(``torch.distributed.pipelining``'s ``Schedule1F1B``, ``ScheduleInterleavedZeroBubble``,
``ScheduleInterleaved1F1B``, ``ScheduleGPipe``). The pair of least step
whose every stage fits the memory limit wins. The plan's program counts ``1/p`` of every parameter's memory
(with its gradient and optimizer state) and one micro-batch's activations of the whole model: the first
stage's under 1F1B with ``m >= p`` (its ``1/p`` of the layers, ``p`` micro-batches of activations each; the
embedding's share aside); the stage peaks reported are the pipeline's own, from the simulated schedule.
Schedules that fill the bubble hold more (interleaved stages' extra micro-batches in flight, zero-bubble's
deferred ``W``s): where the fastest one does not fit, the micro-batch is planned again within its plan's peak
less the overshoot (up to `MEMORY_RETRIES` times), so the program recomputes or shards more and the faster
schedule may fit, as a team trades recomputation for a smaller bubble (llama3-405b on Llama 3's pp 16 x dp
128 x tp 8: 1F1B's 16.1 s step becomes zero-bubble's 9.5 s over 4 stages per rank).

The plan JSON is the micro-batch plan's (placements over the axes after ``pp``) with the whole mesh, a
``pipeline`` block (stages: layer ranges and ranks; schedule; micro-batches; per-stage bubble and peak) and
``predicted`` for the whole step (``step_time_s``, ``bubble_s``, ``peak_memory_bytes``, model FLOPs
utilisation); the micro-batch plan's own figures under ``pipeline.microbatch``; ``pipeline.stage_mesh``,
each stage's ``send_bytes`` and ``pipeline.exchanges`` (a parameter held on several ranks' stages: its
gradient sent once per step from the stage making it, :mod:`strategies.plan.stages`) are what the runtime
(:mod:`runtime.pipeline_step`) builds and sends.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from solver.errors import InfeasibleError
from strategies.cost.mesh import Mesh
from strategies.plan.pipeline import (
    BACKWARD,
    FORWARD,
    GPIPE,
    INTERLEAVED,
    ONE_F_ONE_B,
    WEIGHT,
    ZERO_BUBBLE,
    StageCost,
    action_seconds,
)
from strategies.plan.request import DEFAULT_BATCH, PIPELINE_AXIS, PlanOutcome, PlanRequest, request_record
from strategies.plan.stages import PipelinePrediction, layer_profile, predict_pipeline, stage_link
from strategies.units import bytes_text

PLANNED_SCHEDULES = (ONE_F_ONE_B, ZERO_BUBBLE, INTERLEAVED, GPIPE)
INTERLEAVED_CHUNKS = (2, 4)
"""Stages per rank tried for ``interleaved-1f1b`` (Megatron-LM's virtual pipeline stages)."""
PER_DEVICE_WORK = (
    "compute_s", "load_s", "comm_s", "exposed_comm_s", "hidden_comm_s", "contention_s", "recompute_s",
    "comm_bytes", "model_flops",
)  # fmt: skip
"""What a device does in one micro-batch's plan that it does ``m / p`` times in the pipeline's step."""
MICROBATCH_FACTORS = (1, 2, 4)
"""Micro-batch counts tried where the request leaves it open: these multiples of the stage count."""
MEMORY_RETRIES = 2
"""Micro-batch plans made again, within less memory, for a faster schedule that does not fit (each one more
solve: two reached every fit seen, llama3-405b's interleaved schedule on pp 16 x dp 128 x tp 8)."""


def plan_pipeline(
    request: PlanRequest,
    mesh: Mesh,
    say: Callable[[str], None],
    plan_model: Callable[[PlanRequest, Callable[[str], None]], PlanOutcome],
) -> PlanOutcome:
    """The plan of ``request`` on ``mesh`` (a pipeline axis first): the module docstring; ``plan_model``
    plans each micro-batch on the other axes (the planner's, handed over: it calls this module)."""
    started = time.perf_counter()
    stages, rest_shape, rest_names = _split(mesh, request)
    batch = _batch(request)
    counts = _microbatch_counts(request.microbatches, stages, batch)
    schedules = _schedules(request.schedule)
    limit = int(request.memory_gib * 2**30) if request.memory_gib is not None else mesh.hardware.memory_bytes
    best: tuple[PipelinePrediction, PlanOutcome] | None = None
    outcome: PlanOutcome | None = None
    least_peak = math.inf
    for m in counts:
        say(f"pipeline: {stages} stages, {m} micro-batches of {batch // m}")
        sub = dataclasses.replace(
            request,
            mesh="x".join(str(size) for size in rest_shape),
            axis_names=",".join(rest_names),
            batch=batch // m,
            microbatches=None,
            schedule=None,
            time_limit=request.time_limit / len(counts),
            parameter_memory_share=1.0 / stages,
            cutoff_s=None,
            exact_min_peak=False,  # a stage's peak is the schedule's, not the micro-batch plan's
        )
        for attempt in range(1 + MEMORY_RETRIES):
            outcome = None  # unless the best, its problem goes before the next is built (GBs for llama3-405b)
            try:
                outcome = plan_model(sub, say)
            except InfeasibleError as error:  # this micro-batch size fits no plan; a smaller one may
                say(f"pipeline: {m} micro-batches: {error}")
                if not attempt:  # (a tighter plan's least peak is not a stage's)
                    least_peak = min(least_peak, error.min_peak or math.inf)
                break
            predictions = _predictions(outcome, schedules, stages, m)
            least_peak = min([least_peak, *(max(p.peak_bytes) for p in predictions)])
            for predicted in predictions:
                if max(predicted.peak_bytes) <= limit and (best is None or predicted.step_s < best[0].step_s):
                    best = (predicted, outcome)
            over = [p for p in predictions if max(p.peak_bytes) > limit]
            faster = min(over, key=lambda p: p.step_s, default=None)
            if attempt == MEMORY_RETRIES or faster is None or (best and best[0].step_s <= faster.step_s):
                break
            # a faster schedule holds more activations than the program counts (1F1B's first stage): plan
            # the micro-batch again within less, by the schedule's overshoot, so it recomputes more
            micro_peak = outcome.plan["predicted"]["peak_memory_bytes"]
            tighter = micro_peak - (max(faster.peak_bytes) - limit)
            say(
                f"pipeline: {faster.schedule} ({faster.chunks} per rank) would take {faster.step_s:.3g} s "
                f"but holds {bytes_text(max(faster.peak_bytes))}; the micro-batch plan again within "
                f"{bytes_text(tighter)}"
            )
            if tighter <= 0:
                break
            sub = dataclasses.replace(sub, memory_gib=tighter / 2**30)
    if best is None:
        raise InfeasibleError(
            f"pipeline: no micro-batch count ({', '.join(map(str, counts))}) and schedule "
            f"({', '.join(schedules)}) fits {bytes_text(limit)} per device: the least stage peak is "
            f"{bytes_text(least_peak)}",
            min_peak=int(least_peak),
            min_peak_exact=False,
        )
    predicted, outcome = best
    plan = _pipeline_plan(outcome.plan, mesh, predicted, batch)
    plan["request"] = request_record(request)
    plan["timings"] = {**plan.get("timings", {}), "total": time.perf_counter() - started}
    return PlanOutcome(plan, outcome.built, outcome.result, outcome.timings)


def _predictions(
    outcome: PlanOutcome, schedules: tuple[str, ...], stages: int, m: int
) -> list[PipelinePrediction]:
    """The pipeline of each schedule (and stages per rank) over the micro-batch plan ``outcome``."""
    chosen = np.asarray(outcome.result.solution, dtype=np.int64)
    micro = outcome.plan["predicted"]
    profile = layer_profile(outcome.built, chosen, micro["step_time_s"], micro["peak_memory_bytes"])
    link = stage_link(outcome.built, stages)
    shapes = _schedule_shapes(schedules, stages, m, len(profile.layers))
    if not shapes:  # only an interleaved schedule was asked for
        raise ValueError(
            f"pipeline: {INTERLEAVED} runs at least {min(INTERLEAVED_CHUNKS)} stages of a layer or more "
            f"per rank, its micro-batches a multiple of the ranks: {stages} ranks need "
            f"{stages * min(INTERLEAVED_CHUNKS)} layers and the model has {len(profile.layers)}, with "
            f"{m} micro-batches; use {ONE_F_ONE_B}"
        )
    return [predict_pipeline(profile, stages, m, schedule, link, chunks) for schedule, chunks in shapes]


def _batch(request: PlanRequest) -> int:
    """The step's batch: the request's, or a factory's own (its micro-batches are its first rows)."""
    if request.batch is not None or ":" not in request.model:
        return request.batch or DEFAULT_BATCH
    from strategies.models.builder import factory_batch, load_model

    return factory_batch(load_model(request.model))


def _split(mesh: Mesh, request: PlanRequest) -> tuple[int, tuple[int, ...], tuple[str, ...]]:
    names = mesh.axis_names
    if names[0] != PIPELINE_AXIS:
        raise ValueError(
            f"axis_names: the pipeline axis {PIPELINE_AXIS} must come first, got {','.join(names)}"
        )
    if request.baseline is not None:
        raise ValueError("baseline: hand-written layouts have no pipeline axis; plan without --baseline")
    if request.graph is not None:
        raise ValueError("graph: a pipeline is planned from a model, not from a graph document (yet)")
    rest_shape, rest_names = mesh.shape[1:], names[1:]
    if not rest_shape:
        rest_shape, rest_names = (1,), ("dp",)
    return mesh.shape[0], rest_shape, rest_names


def microbatch_sizes(stages: int, batch: int) -> list[int]:
    """The micro-batch sizes a pipeline of ``stages`` at ``batch`` is planned at where its micro-batch count
    is left open (a search captures each once)."""
    return [batch // m for m in _microbatch_counts(None, stages, batch)]


def _microbatch_counts(asked: int | None, stages: int, batch: int) -> list[int]:
    if asked is not None:
        if asked < 1 or batch % asked:
            raise ValueError(f"microbatches: {asked} does not divide the batch of {batch}")
        return [asked]
    counts = [f * stages for f in MICROBATCH_FACTORS if batch % (f * stages) == 0]
    if not counts:
        raise ValueError(
            f"batch: {batch} is not a multiple of the {stages} stages (a pipeline needs at least one "
            "micro-batch per stage); give a batch that is, or --microbatches"
        )
    return counts


def _schedules(asked: str | None) -> tuple[str, ...]:
    if asked is None:
        return PLANNED_SCHEDULES
    if asked not in PLANNED_SCHEDULES:
        raise ValueError(f"schedule: {asked!r}; choose {', '.join(PLANNED_SCHEDULES)}")
    return (asked,)


def _schedule_shapes(
    schedules: tuple[str, ...], ranks: int, microbatches: int, layers: int
) -> list[tuple[str, int]]:
    """Each schedule with the stages per rank it runs: one, and for ``interleaved-1f1b`` and ``zero-bubble``
    each of `INTERLEAVED_CHUNKS` that leaves every stage a layer (its micro-batches a multiple of the ranks;
    ``interleaved-1f1b`` has no single-stage form: that is ``1f1b``)."""
    shapes = []
    for schedule in schedules:
        if schedule != INTERLEAVED:
            shapes.append((schedule, 1))
        if schedule in (INTERLEAVED, ZERO_BUBBLE) and microbatches % ranks == 0:
            shapes += [(schedule, v) for v in INTERLEAVED_CHUNKS if ranks * v <= layers]
    return shapes


def _stage_seconds(cost: StageCost, schedule: str) -> dict[str, float]:
    """A stage's seconds per micro-batch as its schedule runs them: forward, backward (a zero-bubble
    schedule's ``B``) and a zero-bubble schedule's ``W``."""
    kinds = {"forward_s": FORWARD, "backward_s": BACKWARD, "weight_s": WEIGHT}
    return {key: action_seconds(kind, cost, schedule) for key, kind in kinds.items()}


def _pipeline_plan(
    micro: dict[str, Any], mesh: Mesh, predicted: PipelinePrediction, batch: int
) -> dict[str, Any]:
    """The micro-batch plan ``micro`` as the whole pipeline's (module docstring)."""
    per_stage, ranks = math.prod(mesh.shape[1:]), mesh.shape[0]
    micro_predicted = micro["predicted"]
    step = predicted.step_s
    # each device runs its stage's share of every micro-batch: the micro-batch plan's work (the whole model
    # on one stage's devices) times the micro-batches over the stages
    share = predicted.microbatches / ranks
    at_peak_s = micro_predicted["mfu"] * micro_predicted["step_time_s"] * share
    plan = dict(micro)
    plan["mesh"] = {**micro["mesh"], "shape": list(mesh.shape), "axis_names": list(mesh.axis_names)}
    plan["pipeline"] = {
        "axis": PIPELINE_AXIS,
        "stage_mesh": {key: micro["mesh"][key] for key in ("shape", "axis_names")},
        "schedule": predicted.schedule,
        "microbatches": predicted.microbatches,
        "microbatch_size": batch // predicted.microbatches,
        "chunks": predicted.chunks,
        "stages": [
            {
                "layers": [layers.start, layers.stop],
                "ranks": [(k % ranks) * per_stage, (k % ranks + 1) * per_stage],
                "bubble_s": predicted.bubble_s[k % ranks],
                "peak_memory_bytes": int(predicted.peak_bytes[k % ranks]),
                "send_bytes": list(predicted.cut_bytes[k]) if k < len(predicted.cut_bytes) else [0.0, 0.0],
                "collectives": predicted.collectives[k],
                "comm_bytes": predicted.comm_bytes[k],
                **_stage_seconds(predicted.stage_costs[k], predicted.schedule),
            }
            for k, layers in enumerate(predicted.stages)
        ],
        "send_bytes": predicted.send_bytes,
        "exchanges": [
            {
                "parameter": x.name,
                "from_stage": x.from_stage,
                "to_stages": list(x.to_stages),
                "bytes": x.nbytes,
            }
            for x in predicted.exchanges
        ],
        "microbatch": {key: micro_predicted[key] for key in ("step_time_s", "peak_memory_bytes", "mfu")},
    }
    whole = {key: value for key, value in micro_predicted.items() if key not in ("fastest", "memory_profile")}
    whole.update({key: micro_predicted[key] * share for key in PER_DEVICE_WORK if key in micro_predicted})
    whole["collectives"] = {name: round(n * share) for name, n in micro_predicted["collectives"].items()}
    plan["predicted"] = {
        **whole,
        "step_time_s": step,
        "bubble_s": max(predicted.bubble_s),
        "peak_memory_bytes": int(max(predicted.peak_bytes)),
        "mfu": at_peak_s / step if step > 0 else 0.0,
    }
    return plan


__all__ = ["PLANNED_SCHEDULES", "microbatch_sizes", "plan_pipeline"]
