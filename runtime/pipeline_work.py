"""What a pipeline plan's stage does per micro-batch, and what one step of a rank gathers and measures: the
records :class:`runtime.pipeline_step.PipelineStep` builds and both of its runners
(:mod:`runtime.pipeline_step`'s own loop, :mod:`runtime.pipeline_stages`' ``torch.distributed.pipelining``
stages) fill."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import fx
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from runtime.plan_checks import Placements
from runtime.planned_step import Deviation, LiveBytes
from runtime.recomputation import Entry
from strategies.graph.capture import JointGraph
from strategies.plan.pipeline import BACKWARD, FORWARD, WEIGHT, Action

AHEAD, BACK = 0, 1
"""Directions over a cut: with the forward, with the backward."""


@dataclass
class StageWork:
    """One stage's ops and what it receives and sends, per micro-batch."""

    entries: dict[str, list[Entry]] = field(default_factory=lambda: {FORWARD: [], BACKWARD: [], WEIGHT: []})
    """Per action kind, its ops in order: the forward's (``F``); the whole backward's, or a zero-bubble
    schedule's ``B`` (what makes the activations' gradients, and the recomputations); its ``W`` (the
    backward's ops making only parameters' gradients)."""
    receives: tuple[list[fx.Node], list[fx.Node]] = field(default_factory=lambda: ([], []))
    """Received before its forward (over the cut before it), before its backward (over the cut after it)."""
    sends: tuple[list[fx.Node], list[fx.Node]] = field(default_factory=lambda: ([], []))
    """Sent after its forward (over the cut after it), after its backward (over the cut before it)."""
    drops: dict[str, list[list[fx.Node]]] = field(default_factory=dict)
    """Per action kind (``F``, ``B``, ``W``), per entry, the values whose last use on this stage it is."""
    after_sends: tuple[list[fx.Node], list[fx.Node]] = field(default_factory=lambda: ([], []))
    """Values that go once the forward's / the backward's sends are made."""


@dataclass(frozen=True)
class Hop:
    """Values going over one cut for one action: to (or from) the neighbouring ``stage``."""

    nodes: Sequence[fx.Node]
    stage: int
    action: Action
    direction: int

    @property
    def cut(self) -> int:
        return min(self.stage, self.action.stage)


@dataclass
class StepState:
    """What one step gathers as its actions run."""

    live: LiveBytes = field(default_factory=LiveBytes)
    deviations: list[Deviation] = field(default_factory=list)
    pending: list[Any] = field(default_factory=list)
    """(the send, its tensor) of every send made, waited for at the step's end."""
    losses: list[torch.Tensor] = field(default_factory=list)
    gradients: dict[str, DTensor] = field(default_factory=dict)
    draws: dict[tuple[fx.Node, int], Any] = field(default_factory=dict)
    """(random op, micro-batch) -> the generator state it draws from."""


@dataclass
class PipelineMeasure:
    """What one step of this rank measured: seconds per action kind and stage, bytes sent."""

    forward_s: dict[int, float] = field(default_factory=dict)
    backward_s: dict[int, float] = field(default_factory=dict)
    """The whole backward's, or a zero-bubble schedule's ``B``'s."""
    weight_s: dict[int, float] = field(default_factory=dict)
    """A zero-bubble schedule's ``W``'s."""
    waited_s: float = 0.0
    """Waiting for what another rank sends (idle, not the stage's time)."""
    sent_bytes: int = 0
    step_s: float = 0.0

    def spent(self, action: Action, seconds: float) -> None:
        """``seconds`` of ``action``'s stage busy on its kind of action."""
        spent = {FORWARD: self.forward_s, BACKWARD: self.backward_s, WEIGHT: self.weight_s}[action.kind]
        spent[action.stage] = spent.get(action.stage, 0.0) + seconds


class StageSteps(Protocol):
    """What a runner of a pipeline's actions takes from the step (:class:`runtime.pipeline_step.
    PipelineStep`): its stages' work and how to run one action's ops."""

    graph: JointGraph
    stages: list[range]
    own: list[int]
    work: list[StageWork]
    schedule: str
    microbatches: int
    split: bool
    group: dist.ProcessGroup
    stage_mesh: DeviceMesh
    measured: PipelineMeasure

    def forward_env(
        self, held: Mapping[fx.Node, Any], inputs: Sequence[DTensor | None], step: StepState
    ) -> dict[fx.Node, Any]: ...

    def compute(self, action: Action, env: dict[fx.Node, Any], step: StepState) -> None: ...

    def drop(self, env: dict[fx.Node, Any], nodes: Sequence[fx.Node], live: LiveBytes) -> None: ...

    def planned(self, node: fx.Node) -> Placements: ...

    def piece(self, env: Mapping[fx.Node, Any], node: fx.Node) -> torch.Tensor: ...

    def send(self, hop: Hop, env: dict[fx.Node, Any], pending: list[Any]) -> None: ...

    def receive(self, hop: Hop, env: dict[fx.Node, Any], live: LiveBytes) -> None: ...

    def local_shape(self, meta: torch.Tensor, placements: Placements) -> tuple[int, ...]: ...

    def piece_as_dtensor(
        self, local: torch.Tensor, meta: torch.Tensor, placements: Placements
    ) -> DTensor: ...


__all__ = ["AHEAD", "BACK", "Hop", "PipelineMeasure", "StageSteps", "StageWork", "StepState"]
