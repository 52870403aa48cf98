"""The step as two streams: when a plan's collectives hide behind its compute, and the step time that follows.

A GPU runs a training step's kernels on a compute stream and its collectives on a communication stream; the
step ends when both are done. The simulator replays the chosen plan in execution order:

- **compute stream**: every op node in the order of the step (its position), for its compute time (times the
  node's weight where a captured layer stands for several); input loads first.
- **communication stream**: every redistribution the plan runs (:func:`strategies.plan.plan_json.predict`'s
  moves), one at a time, in the order they become ready:

  - an activation's move is ready when its producer ends, and its consumer waits for it (tensor-parallel
    all-reduces sit on the critical path);
  - a parameter's gather is *prefetched*: gathers are grouped by the layer of their parameter (consecutive
    reads of one layer's parameters, in the forward and again in the backward), and a group's gathers are
    ready when the previous group's first reader starts: one group ahead, as FSDP prefetches the next
    block's all-gather (``prefetch_groups``). Its reader waits for it;
  - a gradient's reduction is ready when its producer ends and nothing in the step waits for it but the
    step's end (DDP's and FSDP's reductions run behind the rest of the backward).

``step_time_s`` is when the last of both streams ends, plus ``contention_s``: a collective running beside
compute slows it (it takes multiprocessors and memory bandwidth), by ``hardware.overlap_slowdown`` seconds per
second hidden. ``exposed_comm_s`` is the time the compute stream spends waiting for the communication (or the
communication runs past the compute's end) and ``hidden_comm_s`` the rest of the communication.
``prefetch_bytes`` is the largest group of gathered parameters held while the group before it runs (the
memory a prefetch costs beside the step's peak). A group of gathers, and the gradient reductions of one
layer, run as one collective each (*buckets*, as FSDP gathers a block's parameters in one all-gather and DDP
and FSDP reduce a block's gradients together): their launch and latency are paid once. Otherwise durations
are the plan's own (the cost model's): the simulator decides what overlaps.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from strategies.problem.builder import BuiltProblem
from strategies.problem.comm_roles import GRADIENT, PARAMETER
from strategies.problem.layer_sharing import layer_of

PREFETCH_GROUPS = 1
"""How many groups of parameter gathers run ahead of the compute that reads them (FSDP's default: one)."""


@dataclass(frozen=True)
class Move:
    """One redistribution the plan runs: problem edge ``edge``, ``seconds`` in all (every time it runs,
    weights included), ``nbytes`` the largest gathered local piece (for prefetch memory)."""

    edge: int
    seconds: float
    nbytes: float = 0.0
    fixed_s: float = 0.0
    """The part of ``seconds`` a collective pays whatever its bytes (launch, latency): once per bucket."""


@dataclass
class Schedule:
    """What the two streams do in one step (seconds, bytes per device)."""

    step_time_s: float
    compute_s: float
    load_s: float
    comm_s: float
    exposed_comm_s: float
    hidden_comm_s: float
    hidden_by_kind: dict[str, float] = field(default_factory=dict)
    """Seconds hidden per edge kind (``activation``, ``parameter``, ``gradient``)."""
    comm_by_kind: dict[str, float] = field(default_factory=dict)
    """Seconds in all per edge kind."""
    prefetch_bytes: float = 0.0
    contention_s: float = 0.0
    """Compute lost to the collectives hidden behind it (``hardware.overlap_slowdown`` per hidden second)."""

    def hidden_share(self, kind: str) -> float:
        """The share of ``kind``'s communication the compute hides (0 when there is none)."""
        total = self.comm_by_kind.get(kind, 0.0)
        return self.hidden_by_kind.get(kind, 0.0) / total if total > 0 else 0.0


def simulate(
    built: BuiltProblem,
    chosen: np.ndarray,
    moves: Sequence[Move],
    extra_compute_s: dict[int, float] | None = None,
    prefetch_groups: int = PREFETCH_GROUPS,
    compute_scale: float = 1.0,
    overlap_slowdown: float | None = None,
) -> Schedule:
    """Replay ``chosen`` on two streams (module docstring). ``moves``: every redistribution the plan runs;
    ``extra_compute_s``: seconds added to an op node's compute (the ops a recomputation makes again with it).
    ``compute_scale`` multiplies every compute time and ``overlap_slowdown`` replaces the hardware's (a fit
    of them replays one plan many times)."""
    nodes, weight = built.nodes, built.node_weights()
    extra = extra_compute_s or {}
    step_roles = built.step_roles()
    ops, roles = step_roles.ops, step_roles.roles
    order = {node: k for k, node in enumerate(ops)}
    load = sum(
        float(weight[i] * nodes[i].compute_s[chosen[i]]) for i, n in enumerate(nodes) if n.kind == "input"
    )
    durations = [
        (float(weight[i] * nodes[i].compute_s[chosen[i]]) + extra.get(i, 0.0)) * compute_scale for i in ops
    ]
    slowdown = built.mesh.hardware.overlap_slowdown if overlap_slowdown is None else overlap_slowdown

    tail = {order[node] for node in step_roles.tail}
    needed: dict[int, list[int]] = {}  # op position -> moves its start waits for
    after_op: dict[int, list[int]] = {}  # op position -> moves ready when it ends
    ready_at_start: list[int] = []
    late: list[int] = []
    gathers: list[int] = []
    kinds: list[str] = []
    for m, move in enumerate(moves):
        edge = built.edges[move.edge]
        producer, consumer = nodes[edge.producer], nodes[edge.consumer]
        kind = roles[move.edge]
        kinds.append(kind)
        if consumer.kind == "op":
            needed.setdefault(order[edge.consumer], []).append(m)
        if kind == PARAMETER:
            gathers.append(m)
        elif producer.kind != "op":  # an input or buffer: there from the start
            ready_at_start.append(m)
        elif consumer.kind == "op" and order[edge.producer] >= order[edge.consumer]:
            late.append(m)  # a reader placed before its producer (a view's position): ready at the reader
        else:
            after_op.setdefault(order[edge.producer], []).append(m)
    issue_at, groups, prefetch_bytes = _prefetch_plan(
        built, moves, gathers, order, step_roles.made_from, prefetch_groups
    )
    issue_at.update({m: order[built.edges[moves[m].edge].consumer] for m in late})
    reductions = [m for m, kind in enumerate(kinds) if kind == GRADIENT]
    groups += _reduction_buckets(built, moves, reductions, ops, order)
    durations_of = _bucketed(moves, groups)

    finish: dict[int, float] = {}
    queue: list[tuple[float, int]] = [(load, m) for m in ready_at_start]
    heapq.heapify(queue)
    comm_free = load

    def run_until(m_wanted: int) -> float:
        nonlocal comm_free
        while m_wanted not in finish:
            ready, m = heapq.heappop(queue)
            start = max(ready, comm_free)
            comm_free = start + durations_of[m]
            finish[m] = comm_free
        return finish[m_wanted]

    issued: dict[int, list[int]] = {}
    for m, position in issue_at.items():
        issued.setdefault(position, []).append(m)
    exposed_by_kind: dict[str, float] = {}
    clock = load
    for k, duration in enumerate(durations):
        for m in issued.get(k, ()):
            heapq.heappush(queue, (clock, m))
        start, last = clock, -1
        for m in needed.get(k, ()):
            if run_until(m) > start:
                start, last = finish[m], m
        if k in tail:  # nothing waits for it but a gradient's reduction: it does not hold the compute up
            end, clock = start + duration, clock + duration
        else:
            if last >= 0:  # the wait is charged to the move the op waited for last
                exposed_by_kind[kinds[last]] = exposed_by_kind.get(kinds[last], 0.0) + start - clock
            end = clock = start + duration
        for m in after_op.get(k, ()):
            heapq.heappush(queue, (end, m))
    for m in issued.get(len(durations), ()):
        heapq.heappush(queue, (clock, m))
    while queue:
        run_until(queue[0][1])
    for m, end in finish.items():  # what runs past the compute's end is exposed too
        if end > clock:
            past_end = min(durations_of[m], end - clock)
            exposed_by_kind[kinds[m]] = exposed_by_kind.get(kinds[m], 0.0) + past_end
    compute = sum(durations)
    comm = sum(durations_of)
    exposed = min(comm, max(0.0, max(clock, comm_free) - compute - load))  # no more than there is (rounding)
    contention = slowdown * max(0.0, comm - exposed)
    step = max(clock, comm_free) + contention
    by_kind: dict[str, float] = {}
    for kind, seconds in zip(kinds, durations_of, strict=True):
        by_kind[kind] = by_kind.get(kind, 0.0) + seconds
    hidden_by_kind = {
        kind: max(0.0, total - exposed_by_kind.get(kind, 0.0)) for kind, total in by_kind.items()
    }
    return Schedule(
        step_time_s=step,
        compute_s=compute,
        load_s=load,
        comm_s=comm,
        exposed_comm_s=exposed,
        hidden_comm_s=max(0.0, comm - exposed),
        contention_s=contention,
        hidden_by_kind=hidden_by_kind,
        comm_by_kind=by_kind,
        prefetch_bytes=prefetch_bytes,
    )


def _prefetch_plan(
    built: BuiltProblem,
    moves: Sequence[Move],
    gathers: list[int],
    order: dict[int, int],
    weight_of: dict[int, int],
    prefetch_groups: int,
) -> tuple[dict[int, int], list[list[int]], float]:
    """When each parameter gather is issued (the op position at whose start it becomes ready), and the
    largest group's gathered bytes. Gathers are taken in the order of their readers and grouped by the
    layer of their parameter (runs of one layer; parameters outside the layers form their own group);
    group ``k``'s are issued at the start of group ``k - prefetch_groups``'s first reader."""
    nodes, edges = built.nodes, built.edges

    def parameter_layer(m: int) -> object:
        producer = edges[moves[m].edge].producer
        return _layer_key(nodes[weight_of.get(producer, producer)].name)

    by_reader = sorted(gathers, key=lambda m: order[edges[moves[m].edge].consumer])
    groups = _runs(by_reader, parameter_layer)
    issue_at: dict[int, int] = {}
    for g, group in enumerate(groups):
        ahead = g - prefetch_groups
        position = 0 if ahead < 0 else min(order[edges[moves[m].edge].consumer] for m in groups[ahead])
        for m in group:
            issue_at[m] = position
    prefetch = max((sum(moves[m].nbytes for m in group) for group in groups), default=0.0)
    return issue_at, groups, prefetch


def _reduction_buckets(
    built: BuiltProblem, moves: Sequence[Move], reductions: list[int], ops: list[int], order: dict[int, int]
) -> list[list[int]]:
    """Gradient reductions in buckets, as DDP and FSDP reduce a block's gradients in one collective: runs of
    reductions (in the order their producers run) whose producers sit in one layer, an op's layer being that
    of the last parameter read at or before it."""
    layer_at: list[object] = []
    current = _layer_key("")
    read_by: dict[int, object] = {}
    for edge in built.edges:
        producer = built.nodes[edge.producer]
        if producer.kind == "parameter" and edge.consumer in order:
            read_by[order[edge.consumer]] = _layer_key(producer.name)
    for k in range(len(ops)):
        current = read_by.get(k, current)
        layer_at.append(current)

    def producer_layer(m: int) -> object:
        position = order.get(built.edges[moves[m].edge].producer)
        return layer_at[position] if position is not None else _layer_key("")

    by_producer = sorted(reductions, key=lambda m: order.get(built.edges[moves[m].edge].producer, -1))
    return _runs(by_producer, producer_layer)


def _layer_key(name: str) -> object:
    """The layer a parameter's name puts it in (``layers.N``); every name outside the layers shares one."""
    layer = layer_of(name)
    return ("layer", layer) if layer is not None else ("outside",)


def _runs(items: Sequence[int], key: Callable[[int], object]) -> list[list[int]]:
    """``items`` cut into runs of consecutive items with the same key."""
    runs: list[list[int]] = []
    last: object = object()
    for item in items:
        if (current := key(item)) != last:
            runs.append([])
            last = current
        runs[-1].append(item)
    return runs


def _bucketed(moves: Sequence[Move], groups: list[list[int]]) -> list[float]:
    """Each move's seconds on the communication stream, the moves of a group run as one collective per kind
    of step: the fixed cost (launch, latency) paid by the largest only."""
    seconds = [move.seconds for move in moves]
    for group in groups:
        if len(group) < 2:
            continue
        kept = max(group, key=lambda m: moves[m].fixed_s)
        for m in group:
            if m != kept:
                seconds[m] = max(0.0, seconds[m] - moves[m].fixed_s)
    return seconds
