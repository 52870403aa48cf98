"""A pipeline plan's stages as ``torch.distributed.pipelining`` stage objects, run by its schedule classes.

Each of this rank's stages is a :class:`torch.distributed.pipelining.PipelineStage` over a module whose
forward is one autograd node, :class:`_StageFunction`: its inputs are the pieces received over the cut
before the stage, its outputs the pieces sent over the cut after it, and it runs the stage's forward ops of
the joint graph (:meth:`runtime.pipeline_step.PipelineStep.compute`, every op in its planned placements).
Its backward runs the stage's backward ops (zero-bubble's ``B``; the ``W`` ops run when torch's schedule
calls the stage's ``dw_runner``, built by ``dw_builder`` as torch's F/I/W schedules expect). The schedule is
torch's own class for the plan's (``ScheduleGPipe``, ``Schedule1F1B``, ``ScheduleInterleaved1F1B``,
``ScheduleInterleavedZeroBubble``), so the order, the sends and receives and their pairing are torch's.

Why one autograd node per stage: the joint graph is a forward *and* its backward, traced once; its backward
ops are ops like any other, not autograd's. The node is the boundary torch's stage needs: torch hands the
gradients of the stage's outputs to its backward and sends back what it returns for the stage's inputs.

What crosses a cut back is not always the gradient of something sent forward; the joint graph only says
which backward values an earlier stage reads. Each one rides in a forward value's slot of the same local
shape and dtype (:func:`_slots`): torch sends it back as that slot's "gradient" and the earlier stage reads it
as one; a slot nothing rides in is not differentiable (``mark_non_differentiable``), so torch sends nothing
for it. The static metadata given to each ``PipelineStage`` says so slot by slot. A backward value no slot
has room for (GPT-2's tied embedding: the head's ``vocab x hidden`` contribution to its gradient crosses back,
nothing of that shape goes forward) goes point to point beside torch's sends, within the same backward
actions (sent by the later stage's, received by the earlier one's before it runs its ops; tagged apart from
torch's). The bytes are then exactly the plan's ``send_bytes``. Only a plan where nothing at all crosses a cut
back cannot ride torch's stages (torch would never run the earlier stage's backward): :func:`torch_stages`
says so, and :class:`runtime.pipeline_step.PipelineStep` runs it in its own loop (the same actions in the same
order, its own sends).

Torch's schedule does not tell a stage's module which micro-batch it runs: :class:`_PlannedStage` records the
chunk id torch passes to ``forward_one_chunk`` / ``backward_one_chunk`` (public methods) before each call.
It also counts the bytes of the sends torch makes (``get_fwd_send_ops`` / ``get_bwd_send_ops``).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import fx, nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
)
from torch.distributed.tensor import DTensor

from runtime.pipeline_work import AHEAD, BACK, Hop, StageSteps, StepState
from strategies.plan.pipeline import (
    BACKWARD,
    FORWARD,
    GPIPE,
    INTERLEAVED,
    ONE_F_ONE_B,
    WEIGHT,
    ZERO_BUBBLE,
    Action,
)

SCHEDULES: dict[str, Any] = {
    GPIPE: ScheduleGPipe,
    ONE_F_ONE_B: Schedule1F1B,
    INTERLEAVED: ScheduleInterleaved1F1B,
    ZERO_BUBBLE: ScheduleInterleavedZeroBubble,
}
"""The plan's schedule -> torch's class running it (their orders are the planner's: compared action by action
in ``tests/strategies/plan/test_pipeline.py``)."""


@dataclass(frozen=True)
class CutSlots:
    """What goes over one cut: the values sent forward (the slots, in order) and, per slot, the backward
    value riding back in it (None: nothing comes back in that slot)."""

    forward: tuple[fx.Node, ...]
    back: tuple[fx.Node | None, ...]
    beside: tuple[fx.Node, ...] = ()
    """Backward values no slot has room for (none of their local shape and dtype free): sent point to point
    beside torch's sends, within the same backward (GPT-2's tied head's contribution to the embedding's
    gradient)."""


def _slots(step: StageSteps, cut: int) -> CutSlots:
    """The cut after stage ``cut``: each value the backward sends back over it in the first forward slot of
    its local shape and dtype still free, else beside them."""
    forward = tuple(step.work[cut].sends[AHEAD])
    back: list[fx.Node | None] = [None] * len(forward)
    beside: list[fx.Node] = []
    shapes = [_local_meta(step, node) for node in forward]
    for node in step.work[cut + 1].sends[BACK]:
        wanted = _local_meta(step, node)
        free = [i for i, shape in enumerate(shapes) if back[i] is None and shape == wanted]
        if free:
            back[free[0]] = node
        else:
            beside.append(node)
    return CutSlots(forward, tuple(back), tuple(beside))


def _local_meta(step: StageSteps, node: fx.Node) -> tuple[tuple[int, ...], torch.dtype]:
    meta = node.meta["val"]
    return step.local_shape(meta, step.planned(node)), meta.dtype


class TorchStages:
    """This rank's stages of ``step`` as ``PipelineStage`` objects and torch's schedule over them."""

    def __init__(self, step: StageSteps, slots: Sequence[CutSlots]) -> None:
        self.step, self.slots = step, list(slots)
        device = torch.device(step.stage_mesh.device_type)
        self.stages = [
            _PlannedStage(
                _StageModule(self, index),
                index,
                len(step.stages),
                device,
                **self._metadata(index),
                group=step.group,
                dw_builder=functools.partial(self._weight_runner, index),
            )
            for index in step.own
        ]
        schedule = SCHEDULES[step.schedule]
        single = schedule in (ScheduleGPipe, Schedule1F1B)
        self.schedule = schedule(
            self.stages[0] if single else self.stages,
            step.microbatches,
            loss_fn=_loss_of_output,
            scale_grads=False,  # the step divides the added-up gradients by the micro-batches itself
        )
        self.held: Mapping[fx.Node, Any] = {}
        self.inputs: Sequence[Sequence[DTensor | None]] = ()
        self.state = StepState()
        self.envs: dict[tuple[int, int], dict[fx.Node, Any]] = {}

    @property
    def schedule_name(self) -> str:
        return type(self.schedule).__name__

    def buffer_bytes(self) -> int:
        """The receive buffers torch's stages hold for good (allocated at the first step): one per micro-batch
        of every value coming over a cut, forward and back (the planner counts them in each stage's peak)."""
        held = 0
        for stage in self.stages:
            infos = [*stage.args_recv_info.values(), *stage.grad_recv_info.values()]
            for info in (info for chunk in infos for info in chunk):
                if not info.is_root_arg and info.buffer is not None:
                    held += info.buffer.numel() * info.buffer.element_size()
        return held

    def _metadata(self, stage: int) -> dict[str, Any]:
        """What ``PipelineStage`` takes to run without inferring shapes (torch's static mode): this rank's
        pieces received and sent, and which of them carry something back (their "gradients")."""
        first, last = stage == 0, stage == len(self.step.stages) - 1
        before = None if first else self.slots[stage - 1]
        after = None if last else self.slots[stage]
        loss_dtype = self.step.graph.loss.meta["val"].dtype
        return {
            "input_args": (torch.empty(1, dtype=torch.long, device="meta"),)
            if before is None
            else self._pieces(before, gradients=False),
            "output_args": torch.empty((), dtype=loss_dtype, device="meta", requires_grad=True)
            if after is None
            else self._pieces(after, gradients=False),
            "input_grads": (None,) if before is None else self._pieces(before, gradients=True),
            "output_grads": None if after is None else self._pieces(after, gradients=True),
        }

    def _pieces(self, slots: CutSlots, gradients: bool) -> tuple[torch.Tensor | None, ...]:
        pieces: list[torch.Tensor | None] = []
        for node, back in zip(slots.forward, slots.back, strict=True):
            source = back if gradients else node
            if source is None:
                pieces.append(None)
                continue
            shape, dtype = _local_meta(self.step, source)
            pieces.append(
                torch.empty(
                    shape, dtype=dtype, device="meta", requires_grad=back is not None and not gradients
                )
            )
        return tuple(pieces)

    # one step ------------------------------------------------------------------------------------------

    def run(
        self, held: Mapping[fx.Node, Any], inputs: Sequence[Sequence[DTensor | None]], state: StepState
    ) -> None:
        """One step of torch's schedule over the micro-batches; what it makes goes into ``state``."""
        self.held, self.inputs, self.state = held, inputs, state
        microbatches = torch.arange(self.step.microbatches)
        first = 0 in self.step.own
        last = len(self.step.stages) - 1 in self.step.own
        try:
            self.schedule.step(
                *((microbatches,) if first else ()),
                target=microbatches if last else None,
                return_outputs=False,
            )
            for work, _ in state.pending:  # what went beside torch's sends
                work.wait()
        finally:  # nothing of this step kept past it (its gradients would live on beside the next step's)
            unfinished, self.envs = sorted(self.envs), {}
            self.held, self.inputs, self.state = {}, (), StepState()
        if unfinished:
            raise RuntimeError(f"pipeline: torch's schedule left micro-batches unfinished: {unfinished}")

    def forward(self, stage: int, microbatch: int, received: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Stage ``stage``'s forward on ``microbatch``: its received pieces in, its pieces to send out."""
        begun = time.perf_counter()
        step, state = self.step, self.state
        env = self.envs[(stage, microbatch)] = step.forward_env(self.held, self.inputs[microbatch], state)
        if stage > 0:
            self._take(env, self.slots[stage - 1].forward, received)
        action = Action(FORWARD, stage, microbatch)
        step.compute(action, env, state)
        if stage == len(step.stages) - 1:
            sent = [state.losses[-1].clone()]  # the output becomes autograd's: the step keeps its own
        else:
            sent = [self._piece(env, node) for node in self.slots[stage].forward]
        step.drop(env, step.work[stage].after_sends[AHEAD], state.live)
        step.measured.spent(action, time.perf_counter() - begun)
        return sent

    def backward(self, stage: int, microbatch: int, gradients: Sequence[torch.Tensor | None]) -> list[Any]:
        """Stage ``stage``'s backward (zero-bubble's ``B``) on ``microbatch``: what came back over the cut
        after it in, per slot of the cut before it what goes back (None: nothing)."""
        begun, waited = time.perf_counter(), self.step.measured.waited_s
        step, state = self.step, self.state
        env = self.envs[(stage, microbatch)]
        action = Action(BACKWARD, stage, microbatch)
        if stage < len(step.stages) - 1:
            slots = self.slots[stage]
            carried = [(back, piece) for back, piece in zip(slots.back, gradients, strict=True) if back]
            self._take(env, [back for back, _ in carried], [piece for _, piece in carried])
            step.receive(Hop(slots.beside, stage + 1, action, BACK), env, state.live)
        step.compute(action, env, state)
        back: list[Any] = []
        if stage > 0:
            slots = self.slots[stage - 1]
            back = [None if node is None else self._piece(env, node) for node in slots.back]
            step.send(Hop(slots.beside, stage - 1, action, BACK), env, state.pending)
        step.drop(env, step.work[stage].after_sends[BACK], state.live)
        idle = step.measured.waited_s - waited  # for what comes beside torch's sends
        step.measured.spent(action, time.perf_counter() - begun - idle)
        return back

    def _weight_runner(self, stage: int) -> Callable[[], None]:
        """``dw_builder``: called by torch's stage right after a backward, for that micro-batch's ``W`` (the
        parameters' gradients; nothing under other schedules: their backward made them)."""
        return functools.partial(self._weight, stage, self.stages[self.step.own.index(stage)].chunk)

    def _weight(self, stage: int, microbatch: int) -> None:
        begun = time.perf_counter()
        env = self.envs.pop((stage, microbatch))
        action = Action(WEIGHT, stage, microbatch)
        with torch.no_grad():
            self.step.compute(action, env, self.state)
        if self.step.split:
            self.step.measured.spent(action, time.perf_counter() - begun)

    def _take(
        self, env: dict[fx.Node, Any], nodes: Sequence[fx.Node], pieces: Sequence[torch.Tensor]
    ) -> None:
        for node, piece in zip(nodes, pieces, strict=True):
            env[node] = self.step.piece_as_dtensor(piece.detach(), node.meta["val"], self.step.planned(node))
            self.state.live.add(env[node])

    def _piece(self, env: Mapping[fx.Node, Any], node: fx.Node) -> torch.Tensor:
        # a new tensor object (on the same storage): the piece becomes an output of the stage's autograd node
        return self.step.piece(env, node).detach()


def _loss_of_output(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The last stage's output is its micro-batch's loss already (the joint graph computes it)."""
    return output


class _StageFunction(torch.autograd.Function):
    """One stage's forward and backward on one micro-batch, as one autograd node."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        stages: TorchStages,
        stage: int,
        microbatch: int,
        anchor: torch.Tensor,
        *received: torch.Tensor,
    ) -> Any:
        ctx.stages, ctx.stage, ctx.microbatch = stages, stage, microbatch
        sent = stages.forward(stage, microbatch, received)
        if stage < len(stages.step.stages) - 1:
            ctx.mark_non_differentiable(
                *(piece for piece, back in zip(sent, stages.slots[stage].back, strict=True) if back is None)
            )
        return tuple(sent)

    @staticmethod
    def backward(ctx: Any, *gradients: torch.Tensor) -> Any:
        back = ctx.stages.backward(ctx.stage, ctx.microbatch, gradients)
        return (None, None, None, None, *back)  # the first stage receives nothing: no pieces back


class _StageModule(nn.Module):
    """The module a ``PipelineStage`` wraps: one stage, its forward one :class:`_StageFunction` node. It
    holds no parameters (the step holds them: their gradients are the joint graph's values)."""

    def __init__(self, stages: TorchStages, stage: int) -> None:
        super().__init__()
        self.stages, self.stage = stages, stage
        self.microbatch = 0

    def __call__(self, *received: torch.Tensor) -> Any:
        # without nn.Module's hooks: DTensor's CommDebugMode (counting the step's collectives) tracks modules
        # by global hooks that add a forward hook on every entry and unwind one level per hook, so a module
        # called once per micro-batch within one step unwinds past the root (IndexError, torch 2.13)
        return self.forward(*received)

    def forward(self, *received: torch.Tensor) -> Any:
        if self.stage == 0:  # the first stage's input is its micro-batch's index (a root argument)
            (index,) = received
            if int(index.item()) != self.microbatch:
                raise RuntimeError(f"pipeline: micro-batch {int(index.item())} run as {self.microbatch}")
            received = ()
        # the node needs an input needing a gradient for torch to run its backward (the first stage's
        # inputs are token ids)
        anchor = torch.zeros((), requires_grad=True)
        sent = _StageFunction.apply(self.stages, self.stage, self.microbatch, anchor, *received)
        return sent[0] if self.stage == len(self.stages.step.stages) - 1 else sent


class _PlannedStage(PipelineStage):
    """torch's stage, telling its module which micro-batch it runs, and counting the bytes it sends."""

    @property
    def chunk(self) -> int:
        return self.submod.microbatch  # type: ignore[return-value]

    def forward_one_chunk(self, fwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        self.submod.microbatch = fwd_chunk_id
        return super().forward_one_chunk(fwd_chunk_id, *args, **kwargs)

    def backward_one_chunk(self, bwd_chunk_id: int, *args: Any, **kwargs: Any) -> None:
        self.submod.microbatch = bwd_chunk_id
        super().backward_one_chunk(bwd_chunk_id, *args, **kwargs)

    def get_fwd_send_ops(self, fwd_chunk_id: int) -> list[dist.P2POp]:
        return self._counted(super().get_fwd_send_ops(fwd_chunk_id))

    def get_bwd_send_ops(self, bwd_chunk_id: int) -> list[dist.P2POp]:
        return self._counted(super().get_bwd_send_ops(bwd_chunk_id))

    def _counted(self, ops: list[dist.P2POp]) -> list[dist.P2POp]:
        measured = self.submod.stages.step.measured  # type: ignore[union-attr]
        measured.sent_bytes += sum(op.tensor.numel() * op.tensor.element_size() for op in ops)
        return ops


def torch_stages(step: StageSteps) -> TorchStages | str:
    """This rank's stages of ``step`` on ``torch.distributed.pipelining``, or why they cannot carry it."""
    slots: list[CutSlots] = []
    for cut in range(len(step.stages) - 1):
        found = _slots(step, cut)
        if not any(found.back):
            return (
                f"nothing crosses the cut after stage {cut} back: torch would not run that stage's backward"
            )
        slots.append(found)
    return TorchStages(step, slots)


__all__ = ["SCHEDULES", "CutSlots", "TorchStages", "torch_stages"]
