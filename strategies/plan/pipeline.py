"""A pipeline's step, simulated: stages, micro-batches and a schedule, and what each rank holds.

The first piece of issue 28's pipeline axis (the plan JSON, the search and the runtime come after it): given
what one micro-batch costs on each stage (forward and backward seconds, the activation bytes its forward
leaves for its backward, the bytes it sends to the next stage), the micro-batch count and a schedule of
``torch.distributed.pipelining``, :func:`simulate` replays every rank's actions in that schedule's order:

- an action runs when its rank is free and its inputs are there: a forward needs the previous stage's
  forward of the same micro-batch and its activation sent over the link between the two ranks; a backward
  needs its own forward and the next stage's backward with its gradient sent back (the last stage's
  backward, its own forward only);
- ``gpipe``: every forward, then every backward (``ScheduleGPipe``); ``1f1b``: ``p - rank - 1`` forwards to
  warm up, then one forward and one backward in turn, then the backwards left (``Schedule1F1B``);
  ``interleaved-1f1b``: ``v`` model chunks per rank, stage ``s`` on rank ``s mod p``, Megatron-LM's order
  (Narayanan et al., SC'21, section 2.2; ``ScheduleInterleaved1F1B``): ``2 (p - rank - 1) + (v - 1) p``
  forwards to warm up, chunk ``(k // p) mod v`` and micro-batch ``(k // (p v)) p + k mod p`` for the ``k``-th
  forward (the backward's chunks in reverse), the micro-batch count a multiple of ``p``;
  ``zero-bubble``: each backward split into ``B`` (the activations' gradients, what the stage before waits
  for) and ``W`` (the parameters' gradients, :func:`strategies.problem.stage_groups.weight_gradient_ops`),
  in the order of ``torch.distributed.pipelining``'s ``ScheduleInterleavedZeroBubble`` (its ZB1P, Qi et
  al., "Zero Bubble Pipeline Parallelism", ICLR 2024), one stage per rank or ``v``: ``p - rank - 1``
  forwards to warm up (and ``(v - 1) m / max(1, m // p)`` more), then a forward and a ``B`` in turn, each
  ``B`` from the ``rank``-th on followed by the oldest ``W`` left, then the ``B``s left (each with a ``W``),
  then the ``W``s left: a ``W`` runs where 1F1B's rank would wait (one stage per rank: the bubble
  ``(p - 1)(F + B - W)`` where 1F1B's is ``(p - 1)(F + B + W)``);
- what a rank holds: the activations of the micro-batches whose forward has run and whose backward has not,
  per stage; the peak over the step is what the schedule costs in memory (1F1B: ``min(p - rank, m)``
  micro-batches on rank ``rank``; GPipe: all ``m``); a zero-bubble ``B`` leaves what its ``W`` reads.

The step is when the last rank finishes; the *bubble* of a rank is the step less its busy time. Links are
priced as the cost model prices a point-to-point send: ``bytes / bandwidth + latency``.
:func:`balance` cuts a stack of layers into stages of the least largest stage (the embedding and the output
head make the first and last stages uneven: their extra seconds are given).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

GPIPE, ONE_F_ONE_B, INTERLEAVED, ZERO_BUBBLE = "gpipe", "1f1b", "interleaved-1f1b", "zero-bubble"
SCHEDULES = (GPIPE, ONE_F_ONE_B, INTERLEAVED, ZERO_BUBBLE)
FORWARD, BACKWARD, WEIGHT = "F", "B", "W"


@dataclass(frozen=True)
class StageCost:
    """One micro-batch on one stage."""

    forward_s: float
    backward_s: float
    activation_bytes: float = 0.0
    """What its forward leaves alive for its backward."""
    send_bytes: float = 0.0
    """What it sends to the next stage (activations)."""
    gradient_bytes: float | None = None
    """What the next stage sends back to it (the activations' gradients); None: ``send_bytes``."""
    weight_s: float = 0.0
    """Of ``backward_s``, what makes only parameters' gradients: a zero-bubble schedule's ``W``."""
    weight_bytes: float = 0.0
    """What a zero-bubble ``B`` leaves alive for its ``W`` (activations and gradients ``W`` reads)."""

    @property
    def returned_bytes(self) -> float:
        return self.send_bytes if self.gradient_bytes is None else self.gradient_bytes


@dataclass(frozen=True)
class Link:
    """A point-to-point link between two neighbouring stages' ranks."""

    bandwidth: float
    """Bytes per second."""
    latency: float = 0.0

    def seconds(self, nbytes: float) -> float:
        return nbytes / self.bandwidth + self.latency if nbytes > 0 else 0.0


@dataclass(frozen=True)
class Action:
    kind: str
    """``F``, ``B`` (the whole backward, or a zero-bubble schedule's activations' part) or ``W``."""
    stage: int
    microbatch: int


@dataclass(frozen=True)
class PipelineStep:
    """What :func:`simulate` found: the step and, per rank, its busy time, bubble and peak held."""

    step_s: float
    busy_s: tuple[float, ...]
    peak_microbatches: tuple[int, ...]
    """Micro-batches whose activations a rank holds at its peak (over all its stages)."""
    peak_activation_bytes: tuple[float, ...]
    send_bytes: float
    """Bytes sent between stages in one step, forward activations and backward gradients (all ranks)."""

    @property
    def bubble_s(self) -> tuple[float, ...]:
        return tuple(self.step_s - busy for busy in self.busy_s)


def rank_orders(schedule: str, ranks: int, microbatches: int, chunks: int = 1) -> list[list[Action]]:
    """Each rank's actions in the order ``schedule`` runs them (stages numbered ``0 .. ranks * chunks - 1``,
    stage ``s`` on rank ``s mod ranks``)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule: {schedule!r}; choose {', '.join(SCHEDULES)}")
    if ranks < 1 or microbatches < 1 or chunks < 1:
        raise ValueError("ranks, microbatches and chunks: at least 1 each")
    if schedule not in (INTERLEAVED, ZERO_BUBBLE) and chunks != 1:
        raise ValueError(f"chunks: {schedule} runs one stage per rank")
    if schedule == INTERLEAVED:
        if microbatches % ranks:
            raise ValueError(f"microbatches: {microbatches} is not a multiple of the {ranks} ranks")
        return [_interleaved(rank, ranks, microbatches, chunks) for rank in range(ranks)]
    if schedule == ZERO_BUBBLE:
        rounds = max(1, microbatches // ranks)
        if microbatches % rounds:
            raise ValueError(
                f"microbatches: {microbatches} is not a multiple of its {rounds} rounds of about {ranks} "
                "(torch's zero-bubble schedule asks it)"
            )
        return [_zero_bubble(rank, ranks, microbatches, chunks) for rank in range(ranks)]
    orders = []
    for rank in range(ranks):
        forwards = [Action(FORWARD, rank, i) for i in range(microbatches)]
        backwards = [Action(BACKWARD, rank, i) for i in range(microbatches)]
        if schedule == GPIPE:
            orders.append(forwards + backwards)
            continue
        warmup = min(ranks - rank - 1, microbatches)
        order = forwards[:warmup]
        for i in range(microbatches - warmup):
            order += [forwards[warmup + i], backwards[i]]
        orders.append(order + backwards[microbatches - warmup :])
    return orders


def _interleaved(rank: int, ranks: int, microbatches: int, chunks: int) -> list[Action]:
    total = microbatches * chunks

    def action(kind: str, k: int) -> Action:
        chunk = (k // ranks) % chunks
        if kind == BACKWARD:
            chunk = chunks - 1 - chunk
        microbatch = (k // (ranks * chunks)) * ranks + k % ranks
        return Action(kind, chunk * ranks + rank, microbatch)

    warmup = min((ranks - rank - 1) * 2 + (chunks - 1) * ranks, total)
    order = [action(FORWARD, k) for k in range(warmup)]
    for k in range(total - warmup):
        order += [action(FORWARD, warmup + k), action(BACKWARD, k)]
    return order + [action(BACKWARD, k) for k in range(total - warmup, total)]


def _zero_bubble(rank: int, ranks: int, microbatches: int, chunks: int) -> list[Action]:
    """Rank ``rank``'s actions in the module docstring's zero-bubble order, its ``chunks`` stages taken as
    ``ScheduleInterleavedZeroBubble`` takes them: ``m / max(1, m // ranks)`` micro-batches per chunk in turn,
    forwards up the chunks, backwards down."""
    per_round = microbatches // max(1, microbatches // ranks)
    total = microbatches * chunks
    warmup = min((chunks - 1) * per_round + ranks - 1 - rank, total)
    made = {FORWARD: [0] * chunks, BACKWARD: [0] * chunks}

    def next_of(kind: str, chunk: int) -> Action:
        microbatch = made[kind][chunk]
        made[kind][chunk] += 1
        return Action(kind, chunk * ranks + rank, microbatch)

    order = [next_of(FORWARD, (k // per_round) % chunks) for k in range(warmup)]
    backwards: list[Action] = []
    weights = 0
    for k in range(warmup, warmup + total):
        if k < total:
            order.append(next_of(FORWARD, (k // per_round) % chunks))
        backwards.append(next_of(BACKWARD, chunks - 1 - ((k - warmup) // per_round) % chunks))
        order.append(backwards[-1])
        if k - warmup >= rank:  # the oldest W left follows, but for this rank's first ``rank`` B's
            order.append(Action(WEIGHT, backwards[weights].stage, backwards[weights].microbatch))
            weights += 1
    return order + [Action(WEIGHT, b.stage, b.microbatch) for b in backwards[weights:]]


def simulate(
    stages: Sequence[StageCost],
    microbatches: int,
    schedule: str,
    link: Link | Sequence[Link],
    chunks: int = 1,
) -> PipelineStep:
    """The step of ``stages`` (in model order; ``len(stages)`` must be ``ranks * chunks``) run as
    ``schedule`` over ``microbatches``; ``link``: one for every hop, or one per hop ``s -> s + 1``."""
    if len(stages) % chunks:
        raise ValueError(f"stages: {len(stages)} do not split into {chunks} chunks per rank")
    ranks = len(stages) // chunks
    links = [link] * max(len(stages) - 1, 0) if isinstance(link, Link) else list(link)
    if len(links) != len(stages) - 1:
        raise ValueError(f"link: {len(links)} links for {len(stages)} stages")
    orders = rank_orders(schedule, ranks, microbatches, chunks)
    split = schedule == ZERO_BUBBLE
    done: dict[Action, float] = {}
    free = [0.0] * ranks
    busy = [0.0] * ranks
    held = [0] * ranks
    held_bytes = [0.0] * ranks
    peak = [0] * ranks
    peak_bytes = [0.0] * ranks
    position = [0] * ranks
    last = len(stages) - 1
    while any(position[r] < len(orders[r]) for r in range(ranks)):
        progressed = False
        for rank in range(ranks):
            while position[rank] < len(orders[rank]):
                action = orders[rank][position[rank]]
                ready = _ready(action, done, stages, links, last)
                if ready is None:
                    break
                cost = stages[action.stage]
                start = max(free[rank], ready)
                seconds = action_seconds(action.kind, cost, schedule)
                free[rank] = done[action] = start + seconds
                busy[rank] += seconds
                if action.kind == FORWARD:
                    held[rank] += 1
                    held_bytes[rank] += cost.activation_bytes
                    peak[rank] = max(peak[rank], held[rank])
                    peak_bytes[rank] = max(peak_bytes[rank], held_bytes[rank])
                elif action.kind == BACKWARD and split:  # what its W reads stays
                    held_bytes[rank] += cost.weight_bytes - cost.activation_bytes
                    peak_bytes[rank] = max(peak_bytes[rank], held_bytes[rank])
                else:
                    held[rank] -= 1
                    held_bytes[rank] -= cost.weight_bytes if split else cost.activation_bytes
                position[rank] += 1
                progressed = True
        if not progressed:
            raise AssertionError(f"{schedule}: the ranks' orders wait on each other")
    sent = microbatches * sum(stage.send_bytes + stage.returned_bytes for stage in stages[:-1])
    return PipelineStep(max(free), tuple(busy), tuple(peak), tuple(peak_bytes), sent)


def action_seconds(kind: str, cost: StageCost, schedule: str) -> float:
    """One micro-batch's ``kind`` action on a stage of ``cost`` under ``schedule``: its forward; its backward,
    whole, or under zero-bubble less its ``W``; its ``W`` (none but under zero-bubble)."""
    weight_s = cost.weight_s if schedule == ZERO_BUBBLE else 0.0
    return {FORWARD: cost.forward_s, BACKWARD: cost.backward_s - weight_s, WEIGHT: weight_s}[kind]


def _ready(
    action: Action, done: dict[Action, float], stages: Sequence[StageCost], links: list[Link], last: int
) -> float | None:
    """When ``action``'s inputs are there (None: not yet known, an input's action has not run)."""
    s, i = action.stage, action.microbatch
    if action.kind == WEIGHT:
        return done.get(Action(BACKWARD, s, i))
    if action.kind == FORWARD:
        if s == 0:
            return 0.0
        before = done.get(Action(FORWARD, s - 1, i))
        return None if before is None else before + links[s - 1].seconds(stages[s - 1].send_bytes)
    own = done.get(Action(FORWARD, s, i))
    if own is None:
        return None
    if s == last:
        return own
    after = done.get(Action(BACKWARD, s + 1, i))
    return None if after is None else max(own, after + links[s].seconds(stages[s].returned_bytes))


def balance(layer_s: Sequence[float], stages: int, first_s: float = 0.0, last_s: float = 0.0) -> list[range]:
    """``layer_s`` (seconds per layer, forward and backward) cut into ``stages`` contiguous ranges of at least
    one layer, the largest stage as small as it can be; the first stage also runs ``first_s`` (the
    embedding), the last ``last_s`` (the norm, the output head and the loss). Ties: earlier cuts."""
    n = len(layer_s)
    if not 1 <= stages <= n:
        raise ValueError(f"stages: {stages} for {n} layers (1 to {n})")
    prefix = [0.0]
    for seconds in layer_s:
        prefix.append(prefix[-1] + seconds)

    def cost(start: int, end: int, k: int) -> float:
        extra = (first_s if k == 0 else 0.0) + (last_s if k == stages - 1 else 0.0)
        return prefix[end] - prefix[start] + extra

    # best[k][e]: the least largest stage cutting layers [0, e) into stages 0..k; cut[k][e] its last start
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(stages)]
    cut = [[0] * (n + 1) for _ in range(stages)]
    for e in range(1, n + 1):
        best[0][e] = cost(0, e, 0)
    for k in range(1, stages):
        for e in range(k + 1, n + 1):
            for start in range(k, e):
                value = max(best[k - 1][start], cost(start, e, k))
                if value < best[k][e]:
                    best[k][e], cut[k][e] = value, start
    ranges, end = [], n
    for k in range(stages - 1, 0, -1):
        start = cut[k][end]
        ranges.append(range(start, end))
        end = start
    ranges.append(range(0, end))
    return ranges[::-1]


__all__ = [
    "GPIPE",
    "INTERLEAVED",
    "ONE_F_ONE_B",
    "SCHEDULES",
    "ZERO_BUBBLE",
    "Action",
    "Link",
    "PipelineStep",
    "StageCost",
    "action_seconds",
    "balance",
    "rank_orders",
    "simulate",
]
