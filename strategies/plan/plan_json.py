"""The plan: what the solver chose, in the plan JSON of docs/plan-format.md (version 1), and what it
predicts.

``predicted`` re-derives every figure from the chosen strategies (not from the solver's objective): every
redistribution the plan runs (:func:`plan_moves`, with the steps DTensor takes) and every op's compute are
replayed on two streams (:mod:`strategies.plan.schedule`): ``step_time_s``, ``compute_s``, ``load_s`` (the
inputs' host-to-device loads), ``comm_s``, its ``exposed_comm_s`` and ``hidden_comm_s``, ``contention_s``,
``hidden_share`` per role; ``comm_bytes`` the bytes each device sends or receives; ``model_flops`` and
``mfu``; ``prefetch_bytes``; ``peak_memory_bytes`` the largest per-device total of live tensors over the step
and ``memory_profile`` that total along the step (:func:`memory_profile`). A value that all its readers read
in one same other placement, no larger than its own (the partial output that the loss and its backward both
read replicated), is moved once and the copy replaces it, as the runtime does (the objective prices each edge
on its own); the moves a recomputation makes again are run again. The objective prices a credited share of the
gathers and reductions off and every collective on its own, the schedule hides what overlaps and buckets a
layer's collectives, so ``step_time_s`` may sit on either side of the solver's objective.
Where the plan is not the time-optimal solve's answer but one of smaller peak within the gap
(:mod:`solver.headroom`), ``fastest`` holds that answer's ``step_time_s`` and ``peak_memory_bytes``.
``recompute`` names the ops whose outputs the backward makes again (:mod:`strategies.problem.recompute`);
``recompute_s`` is their share of the step time (their compute, their closures', their redistributions
again) and ``recompute_freed_bytes`` what they do not hold from forward to backward.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from solver.evaluate import usage_profile
from solver.solve import SolveResult
from strategies.cost.comm import fixed_seconds, local_numel, redistribute_steps
from strategies.placement import NONE, spec_text
from strategies.plan.schedule import Move, simulate
from strategies.problem.builder import COST_UNIT_S, BuiltProblem
from strategies.problem.comm_roles import GRADIENT, PARAMETER
from strategies.tensor_meta import dtype_name

PLAN_VERSION = 1
MEMORY_PROFILE_POINTS = 256


def make_plan(
    built: BuiltProblem,
    result: SolveResult,
    request: dict[str, Any] | None = None,
    fastest: SolveResult | None = None,
) -> dict[str, Any]:
    """Plan JSON for a solved problem; ``request`` (model, mesh, budget, …) is kept so the plan can be
    explained and reproduced. ``fastest``: the time-optimal solve's answer where the plan is another one
    (:mod:`solver.headroom`), kept as ``predicted.fastest`` (its step time and peak)."""
    if result.solution is None:
        raise ValueError(f"no plan: the solver returned no solution ({result.status}: {result.message})")
    chosen = np.asarray(result.solution, dtype=np.int64)
    nodes = built.nodes
    parameters = {
        name: spec_text(nodes[i].output_specs[chosen[i], 0]) for name, i in built.parameter_nodes.items()
    }
    if built.repeat is not None:
        parameters = built.repeat.expand_names(parameters)
    inputs = [spec_text(nodes[i].output_specs[chosen[i], 0]) for i in built.input_nodes]
    op_nodes = []
    for i, node in enumerate(nodes):
        if node.kind != "op":
            continue
        op_nodes.append(
            {
                "name": node.name,
                "op": str(node.op),
                "output": [
                    None if meta is None else spec_text(node.output_specs[chosen[i], k])
                    for k, meta in enumerate(node.outputs)
                ],
                "inputs": [_text(node.input_specs[chosen[i], k]) for k in range(node.input_specs.shape[1])],
            }
        )
    predicted = predict(built, chosen)
    predicted["recompute_freed_bytes"] = recompute_freed(built, chosen)
    positions, live_bytes = plan_profile(built, chosen)
    predicted["peak_memory_bytes"] = int(live_bytes.max(initial=0))
    predicted["memory_profile"] = memory_profile(positions, live_bytes)
    if fastest is not None and fastest.solution is not None and list(fastest.solution) != list(chosen):
        quickest = np.asarray(fastest.solution, dtype=np.int64)
        predicted["fastest"] = {
            "step_time_s": predict(built, quickest)["step_time_s"],
            "peak_memory_bytes": int(plan_profile(built, quickest)[1].max(initial=0)),
        }
    mesh = built.mesh
    return {
        "version": PLAN_VERSION,
        "mesh": {
            "shape": list(mesh.shape),
            "axis_names": list(mesh.axis_names),
            "hardware": mesh.hardware.name,
        },
        "parameters": parameters,
        "inputs": inputs,
        "nodes": op_nodes,
        "recompute": [node.name for i, node in enumerate(nodes) if node.recomputed(int(chosen[i]))],
        "predicted": predicted,
        "solver": {
            "backend": result.backend,
            "status": result.status,
            "objective": _seconds(result.cost),
            "bound": _seconds(result.bound),
            "gap": result.gap,
            "seconds": result.seconds,
            "variables": result.variables,
            "constraints": result.constraints,
        },
        "request": request or {},
        "warnings": built.warnings(),
        **(
            {}
            if built.repeat is None
            else {"layers": {"captured": built.repeat.captured, "total": built.repeat.total}}
        ),
    }


@dataclass
class PlanMoves:
    """What a plan runs besides its ops' compute: every redistribution (:class:`Move`), the seconds of the ops
    recomputed with a recomputed op (per that op), and the totals a plan reports."""

    moves: list[Move]
    closure_s: dict[int, float]
    comm_bytes: float
    collectives: dict[str, float]
    recompute_s: float
    edge_collectives: dict[int, dict[str, float]] = field(default_factory=dict)
    """Per edge whose redistribution runs collectives, how many of each (weighted, as ``collectives``)."""
    edge_bytes: dict[int, float] = field(default_factory=dict)
    """Per such edge, their bytes per device (weighted, as ``comm_bytes``)."""


def plan_moves(
    built: BuiltProblem, chosen: np.ndarray, once: set[tuple[int, int]] | None = None
) -> PlanMoves:
    """Every redistribution an assignment runs, as the runtime runs it (a value moved once for all its readers
    moved once; the recomputations' moves again), with the steps DTensor takes. ``once``: the values moved
    once (:func:`moved_once`'s, unless the runtime moves fewer so: a pipeline's)."""
    problem = built.problem
    node_weight, edge_weight = built.node_weights(), built.edge_weights()
    recompute = sum(
        float(node_weight[i] * node.remake_s[chosen[i]])
        for i, node in enumerate(built.nodes)
        if node.recomputed(int(chosen[i])) and node.remake_s is not None
    )
    closure_s: dict[int, float] = {}  # the ops recomputed with a recomputed op, priced on its node
    for k, (u, w) in enumerate(built.recompute_edges):
        seconds = float(problem.edge_matrix(len(built.edges) + k)[chosen[u], chosen[w]]) * COST_UNIT_S
        closure_s[w] = closure_s.get(w, 0.0) + seconds
    recompute += sum(closure_s.values())
    once = moved_once(built, chosen) if once is None else once
    counted: set[tuple[int, int]] = set()
    runs: list[tuple[int, int]] = []  # (edge, how many times its redistribution runs)
    for e, edge in enumerate(built.edges):
        if float(problem.edge_matrix(e)[chosen[edge.producer], chosen[edge.consumer]]) <= 0:
            continue
        value = (edge.producer, edge.output)
        if value in once and value in counted:  # moved once, for its first reader
            continue
        counted.add(value)
        runs.append((e, 1))
    runs += _moved_again(built, chosen, once).items()
    comm_bytes = 0.0
    collectives: dict[str, float] = {}
    edge_collectives: dict[int, dict[str, float]] = {}
    edge_bytes: dict[int, float] = {}
    moves: list[Move] = []
    for e, times in runs:
        edge = built.edges[e]
        producer, consumer = built.nodes[edge.producer], built.nodes[edge.consumer]
        meta = producer.outputs[edge.output]
        src = tuple(int(c) for c in producer.output_specs[chosen[edge.producer], edge.output])
        dst = tuple(int(c) for c in consumer.input_specs[chosen[edge.consumer], edge.argument])
        seconds = largest = fixed = 0.0
        for step in redistribute_steps(built.mesh, meta.shape, meta.itemsize, src, dst):
            if step.collective != "local":
                comm_bytes += step.nbytes * edge_weight[e] * times
                edge_bytes[e] = edge_bytes.get(e, 0.0) + step.nbytes * edge_weight[e] * times
                for counts in (collectives, edge_collectives.setdefault(e, {})):
                    counts[step.collective] = counts.get(step.collective, 0) + edge_weight[e] * times
                seconds += step.seconds
                fixed += fixed_seconds(built.mesh, step)
                largest = max(largest, step.nbytes)
        if seconds <= 0 or not math.isfinite(seconds):
            continue
        scale = float(edge_weight[e]) * times
        moves.append(Move(e, seconds * scale, largest, fixed * scale))
        if times == 1 and edge.kind != "gradient" and consumer.recomputed(int(chosen[edge.consumer])):
            recompute += seconds * float(edge_weight[e]) / 2  # the redistribution made again
    return PlanMoves(moves, closure_s, comm_bytes, collectives, recompute, edge_collectives, edge_bytes)


def predict(built: BuiltProblem, chosen: np.ndarray) -> dict[str, Any]:
    """Step time, compute, communication (seconds and bytes) of an assignment: the two-stream schedule of
    :mod:`strategies.plan.schedule` over every op and every redistribution the plan runs."""
    runs = plan_moves(built, chosen)
    schedule = simulate(built, chosen, runs.moves, runs.closure_s)
    flops, at_peak_s = _model_flops(built)
    return {
        "step_time_s": schedule.step_time_s,
        "compute_s": schedule.compute_s,
        "load_s": schedule.load_s,
        "comm_s": schedule.comm_s,
        "exposed_comm_s": schedule.exposed_comm_s,
        "hidden_comm_s": schedule.hidden_comm_s,
        "contention_s": schedule.contention_s,
        "comm_bytes": int(runs.comm_bytes),
        "recompute_s": runs.recompute_s,
        "collectives": {name: round(count) for name, count in runs.collectives.items()},
        "model_flops": flops,
        "mfu": at_peak_s / schedule.step_time_s if schedule.step_time_s > 0 else 0.0,
        "prefetch_bytes": int(schedule.prefetch_bytes),
        "hidden_share": {
            kind: round(schedule.hidden_share(kind), 4) for kind in sorted(schedule.comm_by_kind)
        },
    }


def earned_credit(built: BuiltProblem, predicted: Mapping[str, Any]) -> dict[str, float]:
    """The credit a plan's schedule (its :func:`predict`) earns per role
    (:mod:`strategies.problem.comm_roles`): the share of its collectives the simulator hides, less what hiding
    costs (``overlap_slowdown``); a role the plan moves nothing for keeps the credit it was solved with."""
    keep = 1.0 - built.mesh.hardware.overlap_slowdown
    credit = dict(built.credit)
    for role in (PARAMETER, GRADIENT):
        if role in predicted["hidden_share"]:
            credit[role] = predicted["hidden_share"][role] * keep
    return credit


def _model_flops(built: BuiltProblem) -> tuple[float, float]:
    """The model's FLOPs per device of one step (each op's whole FLOPs over the devices: work a plan repeats
    on several devices, an op it replicates, counts once, as model FLOPs utilisation is stated; a
    recomputation's not counted again; attention's every query-key pair) and the seconds they take at the
    dense peak of each op's dtype: their ratio to the step time is the model FLOPs utilisation. (Counted as
    each device's share of its chosen strategy, a llama3-70b plan on 256 devices at batch 128 that replicates
    most of its compute read 30.7% at 265 s per step.)"""
    hardware, weight = built.mesh.hardware, built.node_weights()
    devices = built.mesh.size
    flops = at_peak = 0.0
    for i, node in enumerate(built.nodes):
        if node.kind != "op" or node.flops is None:
            continue
        count = float(weight[i] * node.flops.max()) / devices  # the op's whole FLOPs: its replicated strategy
        meta = next((m for m in node.outputs if m is not None), None)
        flops += count
        at_peak += count / hardware.flops_for(dtype_name(meta.dtype) if meta is not None else "float32")
    return flops, at_peak


def recompute_freed(built: BuiltProblem, chosen: np.ndarray) -> int:
    """Bytes per device the recomputed values do not hold from their forward to their backward, over every
    layer of the stack (the left-out layers of a layer repeat too)."""
    left_out = built.repeat.left_out if built.repeat is not None else 0
    repeated = {node.held_for for node in built.nodes if node.kind == "ghost" and node.held_for}
    return sum(
        int(node.memory_bytes[chosen[i]]) * (1 + (left_out if node.name in repeated else 0))
        for i, node in enumerate(built.nodes)
        if node.recomputed(int(chosen[i]))
    )


def plan_profile(built: BuiltProblem, chosen: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(positions, live bytes) of an assignment, as `solver.evaluate.usage_profile`, less the stored values
    no chosen recomputation reads (the program counts them, the runtime frees them: `unused_storage`)."""
    positions, live_bytes = usage_profile(built.problem, chosen)
    for i in built.unused_storage(chosen):
        start, end = built.problem.intervals[i]
        live_bytes[(positions >= start) & (positions < end)] -= int(built.problem.node_usages(i)[chosen[i]])
    return positions, live_bytes


def memory_profile(
    positions: np.ndarray, live_bytes: np.ndarray, max_points: int = MEMORY_PROFILE_POINTS
) -> dict[str, list[int]]:
    """The per-device live bytes over the step (at each position in execution order where a value comes
    alive), at most ``max_points`` of them: past that, the largest of each of ``max_points`` equal runs of
    positions, so the peak and every local high stay."""
    if len(positions) > max_points:
        runs = np.array_split(np.arange(len(positions)), max_points)
        keep = np.array([run[np.argmax(live_bytes[run])] for run in runs if len(run)], dtype=np.int64)
        positions, live_bytes = positions[keep], live_bytes[keep]
    return {"positions": [int(p) for p in positions], "bytes": [int(b) for b in live_bytes]}


def _moved_again(built: BuiltProblem, chosen: np.ndarray, once: set[tuple[int, int]]) -> dict[int, int]:
    """Edges whose redistribution the recomputations of ``chosen`` make once more, as the runtime runs them
    (:mod:`runtime.recomputation`): every argument of an op made again is moved again, but a value moved
    once (its copy replacing it) only when it is itself made again, then for its first reader after that.
    (The program prices these moves only into the recomputed ops themselves, not into their closures.)"""
    again: set[int] = set()
    for w, closure in built.recompute_closures.items():
        if built.nodes[w].recomputed(int(chosen[w])):
            again.update((w, *closure))
    if not again:
        return {}
    moved: dict[int, int] = {}
    first_reader: dict[tuple[int, int], int] = {}
    for e, edge in enumerate(built.edges):
        value = (edge.producer, edge.output)
        if value in once:
            if edge.producer in again:  # made again in its original placement, moved by its next reader
                first_reader.setdefault(value, e)
        elif edge.consumer in again:
            moved[e] = 1
    for e in first_reader.values():
        moved[e] = moved.get(e, 0) + 1
    return moved


def moved_once(built: BuiltProblem, chosen: np.ndarray) -> set[tuple[int, int]]:
    """(producer, output) op values every reader reads in one same other placement whose largest local piece
    is no larger than the value's own: the runtime moves such a value once and the copy replaces it."""
    wanted: dict[tuple[int, int], set[tuple[int, ...]]] = {}
    for edge in built.edges:
        spec = built.nodes[edge.consumer].input_specs[chosen[edge.consumer], edge.argument]
        wanted.setdefault((edge.producer, edge.output), set()).add(tuple(int(c) for c in spec))
    once = set()
    for (producer, output), specs in wanted.items():
        node = built.nodes[producer]
        if node.kind != "op":  # a parameter, buffer or input lives on with its caller: no copy replaces it
            continue
        src = node.output_specs[chosen[producer], output]
        if len(specs) != 1 or (dst := next(iter(specs))) == tuple(int(c) for c in src):
            continue
        shape, mesh_shape = node.outputs[output].shape, built.mesh.shape
        if local_numel(shape, dst, mesh_shape) <= local_numel(shape, tuple(int(c) for c in src), mesh_shape):
            once.add((producer, output))
    return once


def _text(spec: np.ndarray) -> list[str] | None:
    return None if (spec == NONE).all() else spec_text(spec)


def _seconds(cost: float | None) -> float | None:
    if cost is None or not math.isfinite(cost):
        return None
    return cost * COST_UNIT_S
