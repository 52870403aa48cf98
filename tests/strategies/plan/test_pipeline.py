"""The pipeline step simulator (strategies/plan/pipeline.py) against the schedules' closed forms: GPipe and
1F1B take ``(m + p - 1)(f + b)`` on uniform stages, the interleaved schedule cuts the bubble by its ``v``
chunks (Narayanan et al. 2021), 1F1B holds ``p - rank`` micro-batches where GPipe holds all of them, the
zero-bubble schedule's bubble is ``(p - 1)(f + b - w)`` where 1F1B's is ``(p - 1)(f + b + w)`` (Qi et al.
2024, ZB-H1), at no more memory than 1F1B's first rank; and every rank's order is the one
``torch.distributed.pipelining``'s schedule class builds."""

from __future__ import annotations

import itertools

import pytest
import torch

from strategies.plan.pipeline import (
    BACKWARD,
    FORWARD,
    GPIPE,
    INTERLEAVED,
    ONE_F_ONE_B,
    WEIGHT,
    ZERO_BUBBLE,
    Link,
    StageCost,
    balance,
    rank_orders,
    simulate,
)

FREE = Link(bandwidth=1e30)
"""A link that costs nothing: the schedules' own arithmetic."""


def uniform(stages: int, forward: float = 1.0, backward: float = 2.0, activation: float = 10.0) -> list:
    return [StageCost(forward, backward, activation, send_bytes=4.0)] * stages


@pytest.mark.parametrize("schedule", [GPIPE, ONE_F_ONE_B])
@pytest.mark.parametrize(("ranks", "microbatches"), [(4, 8), (4, 4), (2, 16), (8, 3)])
def test_uniform_stages_take_m_plus_p_minus_1_slots(schedule: str, ranks: int, microbatches: int) -> None:
    step = simulate(uniform(ranks), microbatches, schedule, FREE)
    assert step.step_s == pytest.approx((microbatches + ranks - 1) * 3.0)
    assert all(bubble == pytest.approx((ranks - 1) * 3.0) for bubble in step.bubble_s)


def test_1f1b_holds_p_minus_rank_microbatches_where_gpipe_holds_all() -> None:
    one_f_one_b = simulate(uniform(4), 8, ONE_F_ONE_B, FREE)
    gpipe = simulate(uniform(4), 8, GPIPE, FREE)
    assert one_f_one_b.peak_microbatches == (4, 3, 2, 1)
    assert one_f_one_b.peak_activation_bytes == (40.0, 30.0, 20.0, 10.0)
    assert gpipe.peak_microbatches == (8, 8, 8, 8)


@pytest.mark.parametrize(("ranks", "chunks", "microbatches"), [(4, 2, 8), (4, 4, 8), (2, 3, 6)])
def test_interleaving_v_chunks_divides_the_bubble_by_v(ranks: int, chunks: int, microbatches: int) -> None:
    # each rank's chunks together cost what one stage of a 1F1B pipeline does: f = 1, b = 2
    stages = uniform(ranks * chunks, forward=1.0 / chunks, backward=2.0 / chunks, activation=10.0 / chunks)
    step = simulate(stages, microbatches, INTERLEAVED, FREE, chunks=chunks)
    assert step.step_s == pytest.approx(microbatches * 3.0 + (ranks - 1) * 3.0 / chunks)
    # Megatron's first rank holds p (1 + (p - 1) / (p v)) micro-batches' worth of activations: more than 1F1B
    assert step.peak_activation_bytes[0] == pytest.approx(10.0 * ranks * (1 + (ranks - 1) / (ranks * chunks)))


def test_every_rank_runs_every_forward_and_backward_once_forwards_first() -> None:
    for schedule, chunks in ((GPIPE, 1), (ONE_F_ONE_B, 1), (INTERLEAVED, 3)):
        orders = rank_orders(schedule, 4, 8, chunks)
        for rank, order in enumerate(orders):
            stages = {rank + 4 * chunk for chunk in range(chunks)}
            expected = {(kind, s, i) for kind in (FORWARD, BACKWARD) for s in stages for i in range(8)}
            assert sorted((a.kind, a.stage, a.microbatch) for a in order) == sorted(expected)
            seen = [(a.kind, a.stage, a.microbatch) for a in order]
            for kind, s, i in seen:
                if kind == BACKWARD:
                    assert seen.index((FORWARD, s, i)) < seen.index((BACKWARD, s, i))


@pytest.mark.parametrize(("ranks", "microbatches"), [(4, 8), (4, 4), (2, 16), (8, 16)])
def test_zero_bubble_fills_the_1f1b_bubble_with_the_weights_gradients(ranks: int, microbatches: int) -> None:
    # f = 1, the activations' gradients b = 1, the parameters' w = 1 (a whole backward 2); what W reads: 6
    stages = [StageCost(1.0, 2.0, 10.0, send_bytes=4.0, weight_s=1.0, weight_bytes=6.0)] * ranks
    zero_bubble = simulate(stages, microbatches, ZERO_BUBBLE, FREE)
    one_f_one_b = simulate(stages, microbatches, ONE_F_ONE_B, FREE)
    assert one_f_one_b.bubble_s[0] == pytest.approx((ranks - 1) * 3.0)
    assert all(bubble == pytest.approx((ranks - 1) * 1.0) for bubble in zero_bubble.bubble_s)
    assert zero_bubble.step_s == pytest.approx(microbatches * 3.0 + (ranks - 1) * 1.0)
    # the first rank holds what 1F1B's does; later ranks more (their W wait), never above the first
    assert zero_bubble.peak_activation_bytes[0] == one_f_one_b.peak_activation_bytes[0]
    assert max(zero_bubble.peak_activation_bytes) == zero_bubble.peak_activation_bytes[0]
    assert zero_bubble.peak_activation_bytes[-1] > one_f_one_b.peak_activation_bytes[-1]
    # without a weights' part to move, it is 1F1B
    whole = [StageCost(1.0, 2.0, 10.0, send_bytes=4.0)] * ranks
    assert simulate(whole, microbatches, ZERO_BUBBLE, FREE).step_s == pytest.approx(one_f_one_b.step_s)


def test_zero_bubble_runs_each_w_after_its_b_and_the_first_ranks_at_once() -> None:
    orders = rank_orders(ZERO_BUBBLE, 4, 8)
    for rank, order in enumerate(orders):
        seen = [(a.kind, a.microbatch) for a in order]
        assert sorted(seen) == sorted((kind, i) for kind in (FORWARD, BACKWARD, WEIGHT) for i in range(8))
        assert all(seen.index((BACKWARD, i)) < seen.index((WEIGHT, i)) for i in range(8))
        # rank r's first r B's go without their W: those fill its wait for the B's after them
        first_weight = seen.index((WEIGHT, 0))
        assert sum(kind == BACKWARD for kind, _ in seen[:first_weight]) == rank + 1
    with pytest.raises(ValueError, match="rounds"):
        rank_orders(ZERO_BUBBLE, 4, 9)


class _StageStandIn:
    """What ``torch.distributed.pipelining``'s schedules read of a stage to build their order (torch's own
    tests stand in for a stage alike): no process group, no module to run."""

    def __init__(self, stage: int, rank: int, ranks: int, stages: int) -> None:
        self.stage_index, self.group_rank, self.group_size, self.num_stages = stage, rank, ranks, stages
        self.is_first, self.is_last = stage == 0, stage == stages - 1
        self.submod = torch.nn.Linear(1, 1)


def torch_orders(
    schedule: str, ranks: int, microbatches: int, chunks: int
) -> list[list[tuple[str, int, int]]]:
    """Each rank's computations in the order ``torch.distributed.pipelining``'s schedule class builds them
    (its ``pipeline_order``), as (kind, stage, micro-batch); torch's ``I`` (a zero-bubble backward's
    activations' part) is our ``B``."""
    from torch.distributed.pipelining import schedules

    classes = {
        GPIPE: schedules.ScheduleGPipe,
        ONE_F_ONE_B: schedules.Schedule1F1B,
        INTERLEAVED: schedules.ScheduleInterleaved1F1B,
        ZERO_BUBBLE: schedules.ScheduleInterleavedZeroBubble,
    }
    kinds = {"F": FORWARD, "B": BACKWARD, "I": BACKWARD, "W": WEIGHT}
    orders = []
    for rank in range(ranks):
        stages = [_StageStandIn(rank + k * ranks, rank, ranks, ranks * chunks) for k in range(chunks)]
        if schedule in (GPIPE, ONE_F_ONE_B):
            built = classes[schedule](stages[0], microbatches)._get_pipeline_order()
        else:
            built = classes[schedule](stages, microbatches).pipeline_order
        orders.append(
            [
                (kinds[a.computation_type.value], a.stage_index, a.microbatch_index)
                for a in built[rank]
                if a is not None and a.computation_type.value in kinds
            ]
        )
    return orders


@pytest.mark.parametrize(
    ("schedule", "ranks", "microbatches", "chunks"),
    [
        (GPIPE, 4, 8, 1),
        (ONE_F_ONE_B, 4, 8, 1),
        (INTERLEAVED, 4, 8, 2),
        (INTERLEAVED, 2, 6, 3),
        (ZERO_BUBBLE, 4, 8, 1),
        (ZERO_BUBBLE, 8, 16, 1),
        (ZERO_BUBBLE, 4, 4, 1),
        (ZERO_BUBBLE, 4, 8, 2),
        (ZERO_BUBBLE, 2, 6, 3),
        (ZERO_BUBBLE, 4, 12, 2),
    ],
)
def test_every_rank_runs_torchs_order(schedule: str, ranks: int, microbatches: int, chunks: int) -> None:
    ours = [
        [(a.kind, a.stage, a.microbatch) for a in order]
        for order in rank_orders(schedule, ranks, microbatches, chunks)
    ]
    theirs = torch_orders(schedule, ranks, microbatches, chunks)
    if schedule == ONE_F_ONE_B:
        # torch 2.13's Schedule1F1B._get_pipeline_order numbers the last rank's forwards from 1 (its warm-up
        # is empty, and the steady state counts on from the warm-up's last forward): micro-batches 1 to m,
        # where the schedule it runs (_step_microbatches) does 0 to m - 1, as ours
        theirs[-1] = [(kind, s, i - 1 if kind == FORWARD else i) for kind, s, i in theirs[-1]]
    assert ours == theirs


def test_a_slow_link_and_a_slow_stage_lengthen_the_step() -> None:
    base = simulate(uniform(4), 8, ONE_F_ONE_B, FREE).step_s
    sends = simulate(uniform(4), 8, ONE_F_ONE_B, Link(bandwidth=4.0, latency=0.5)).step_s  # 1.5 s a hop
    assert sends > base
    slow = uniform(4)
    slow[2] = StageCost(2.0, 4.0, 10.0, 4.0)  # the slowest stage sets the pace
    step = simulate(slow, 8, ONE_F_ONE_B, FREE)
    # at least its 8 slots of 6 s, after the forwards before it (2 s) and before the backwards after it
    # (4 s); at most every stage as slow as it
    assert 2.0 + 8 * 6.0 + 4.0 <= step.step_s < (8 + 3) * 6.0
    assert step.busy_s[2] == 48.0 and step.bubble_s[2] == step.step_s - 48.0
    assert simulate(uniform(4), 8, ONE_F_ONE_B, FREE).send_bytes == 2 * 8 * 3 * 4.0


def test_balance_cuts_the_least_largest_stage_with_the_embedding_and_head_on_the_ends() -> None:
    assert balance([1.0] * 8, 4) == [range(0, 2), range(2, 4), range(4, 6), range(6, 8)]
    cut = balance([1.0] * 12, 4, first_s=2.0, last_s=1.0)
    costs = [len(r) + (2.0 if k == 0 else 0.0) + (1.0 if k == 3 else 0.0) for k, r in enumerate(cut)]
    assert max(costs) == 4.0  # 15 s over 4 stages: 3.75 at best, and whole layers
    assert len(cut[0]) < len(cut[1]) and len(cut[3]) < len(cut[2])  # the ends carry the embedding and head
    assert cut[0].start == 0 and cut[-1].stop == 12
    assert all(a.stop == b.start for a, b in itertools.pairwise(cut))
    with pytest.raises(ValueError, match="stages"):
        balance([1.0] * 3, 4)


def test_bad_schedules_are_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match="schedule"):
        rank_orders("zigzag", 4, 8)
    with pytest.raises(ValueError, match="microbatches"):
        rank_orders(INTERLEAVED, 4, 6, chunks=2)
    with pytest.raises(ValueError, match="chunks"):
        rank_orders(ONE_F_ONE_B, 4, 8, chunks=2)
