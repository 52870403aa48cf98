"""A training step of a pipeline plan: this rank's stages, run in the plan's schedule over micro-batches.

A pipeline plan (``plan["pipeline"]``) is one plan of the whole model at the size of a micro-batch on the
mesh's axes after ``pp``, its layers cut into stages (:mod:`strategies.plan.pipeline_plan`). Each rank holds
the stages of its slice of the ``pp`` axis and runs them on its *stage mesh* (the other axes), every op in the
plan's placements, as :class:`runtime.planned_step.PlannedStep` runs a whole step:

- which stage runs an op is the planner's rule (:mod:`strategies.problem.stage_groups`), so the stages are
  the ones priced; a stage holds only the parameters its ops read;
- the actions are the schedule's, in the order the planner simulated (:func:`strategies.plan.pipeline.
  rank_orders`: ``gpipe``, ``1f1b``, ``interleaved-1f1b``, ``zero-bubble`` as ``torch.distributed.
  pipelining``'s schedule classes order them, action by action): a forward runs a stage's forward ops on
  one micro-batch, a backward its backward ops (and the recomputations the plan makes there); a zero-bubble
  schedule's backward is two actions, ``B`` (the ops whose results reach another layer, the recomputations,
  the sends back) and later ``W`` (the ops making only parameters' gradients,
  :func:`strategies.problem.stage_groups.weight_gradient_ops`), the values ``W`` reads kept alive between;
- what crosses a cut goes as ``torch.distributed.pipelining`` hands a stage's outputs to the next: every value
  read beyond the cut is sent over it, forward with the forward, and what an earlier stage's backward reads
  (the activations' gradients) back with the backward; each rank sends its local piece, in the producing
  op's planned placements, to the rank at its coordinate of the neighbouring stage (point-to-point on the
  ``pp`` group), so the bytes are the plan's ``send_bytes``;
- who runs the actions: torch's own ``PipelineStage`` objects under its schedule class for the plan's
  schedule (:mod:`runtime.pipeline_stages`); where they cannot carry the plan (nothing crosses a cut back:
  ``own_loop_because`` says so) this module's own loop, the same actions in
  :func:`~strategies.plan.pipeline.rank_orders`' order with its own sends;
- the gradients of the micro-batches add up and are divided by their count (the step's loss is the mean of
  the micro-batches' losses, as one process's mean over the batch when they are equal); the loss is sent
  from the last stage to every rank.

A parameter read on stages of several ranks (GPT-2's embedding, tied to its output head) is placed on each;
its gradient is made where its contributions add up (the other stage's reach it over the cuts, as the plan
prices them), and at the step's end sent to every other holder (`PipelineStep._exchange`, the plan's
``pipeline.exchanges``), so each steps its optimizer on the same gradient and the copies stay one.

Random ops (dropout) draw what one process draws training on the same micro-batches one after another (the
step a pipeline is; :class:`runtime.one_process.Reference` checks it so): at the step's start every rank
finds where each forward random op of each micro-batch draws from, by drawing them in that order over
stand-ins (:meth:`PipelineStep._draw_states`); each op then draws from its micro-batch's state, the whole of
its micro-batch's tensor on every rank of its stage, each keeping its piece (:mod:`runtime.random_ops`), and
a recomputation draws again from the same state. The stand-in draws cost each rank one process's draws of a
step again (the masks are not kept: one at a time).

A plan of a short capture of a deep model (``plan["layers"]``) runs as any plan of one does, every layer as
the captured layer standing for it (:func:`runtime.full_depth.expand_plan`, by ``apply_plan``, the short
capture taken at the micro-batch size): the stages are cut from the whole stack.

Inputs come whole (every rank alike, each keeping its part of each micro-batch) or as each rank's own part,
as a data loader gives them (:meth:`PipelineStep.input_slices`): its part of every micro-batch, for the inputs
its stages read only.
"""

from __future__ import annotations

import contextlib
import operator
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import fx
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate

from runtime import random_ops
from runtime.local_inputs import microbatch_slices
from runtime.parameter_shards import local_part
from runtime.pipeline_stages import torch_stages
from runtime.pipeline_work import AHEAD, BACK, Hop, PipelineMeasure, StageWork, StepState
from runtime.plan_checks import Placements, PlanMismatch
from runtime.plan_specs import release_mask
from runtime.planned_step import LiveBytes, PlannedStep, StepResult, redistribute
from runtime.recomputation import Entry
from strategies.graph.capture import JointGraph, microbatch_rows
from strategies.placement import to_dtensor
from strategies.plan.pipeline import BACKWARD, FORWARD, WEIGHT, ZERO_BUBBLE, Action, rank_orders
from strategies.problem.stage_groups import crossed_cuts, op_groups, stage_of_group, weight_gradient_ops


class PipelineStep:
    """This rank's stages of a pipeline plan ``plan`` on ``mesh`` (its first axis ``pp``), the step captured
    at the micro-batch size as ``graph``."""

    def __init__(self, graph: JointGraph, plan: Mapping[str, Any], mesh: DeviceMesh) -> None:
        pipeline = plan["pipeline"]
        if "layers" in plan:
            raise PlanMismatch(
                "pipeline: a plan of a short capture runs expanded to every layer (apply_plan)"
            )
        self.mesh, self.stage_mesh = mesh, stage_mesh(mesh)
        self.group = mesh.get_group(0)
        self.ranks, self.rank = mesh.size(0), mesh.get_local_rank(0)
        self.stages = [range(*stage["layers"]) for stage in pipeline["stages"]]
        self.microbatches, self.microbatch_size = pipeline["microbatches"], pipeline["microbatch_size"]
        self.schedule = pipeline["schedule"]
        self.order: list[Action] = rank_orders(
            pipeline["schedule"], self.ranks, self.microbatches, pipeline.get("chunks", 1)
        )[self.rank]
        self.split = pipeline["schedule"] == ZERO_BUBBLE  # the backward runs as B and W
        self.own = sorted({action.stage for action in self.order})
        micro = {key: value for key, value in plan.items() if key != "pipeline"}
        micro["mesh"] = {
            **plan["mesh"],
            "shape": list(self.stage_mesh.shape),
            "axis_names": list(self.stage_mesh.mesh_dim_names or ()),
        }
        self.inner = PlannedStep(graph, micro, self.stage_mesh)
        self.graph = graph
        groups = op_groups(graph.order, graph.module_path, graph.backward_start)
        self.stage_of = {node: stage_of_group(groups[node.name], self.stages) for node in graph.order}
        self.weight_ops = (
            weight_gradient_ops(graph.order, graph.backward_start, groups) if self.split else set()
        )
        self.work = self._work()
        self.parameter_placements = {
            name: placements
            for name, placements in self.inner.parameter_placements.items()
            if self._reading_stages(graph.parameters[name]) & set(self.own)
        }
        # a value another stage may read goes in its planned placements: one read by another layer's ops (the
        # planner's rule, whatever the cut) is moved for each reader, not once
        self.inner.moved_once = {
            key for key in self.inner.moved_once if not self._read_in_other_group(*key, groups)
        }
        self.widest = max((len(w.sends[d]) for w in self.work for d in (AHEAD, BACK)), default=0) or 1
        self.shared = self._shared()
        self.drawing = [  # the forward's random ops, in one process's order (the backward's draw from them)
            node
            for node in graph.order[: graph.backward_start]
            if random_ops.draws_random(node.target, node.args, node.kwargs)
        ]
        self.measured = PipelineMeasure()
        runner = torch_stages(self)
        self.torch_stages = None if isinstance(runner, str) else runner
        self.own_loop_because = runner if isinstance(runner, str) else None
        """Why the step runs in this module's own loop rather than on torch's stages (None: on torch's)."""

    # what runs where ------------------------------------------------------------------------------------

    def _readers(self, node: fx.Node) -> list[fx.Node]:
        """The ops reading ``node``'s value (a ``getitem``'s readers for a tuple)."""
        return [user for user in node.users if user in self.stage_of]

    def _reading_stages(self, node: fx.Node) -> set[int]:
        return {self.stage_of[user] for user in self._readers(node)}

    def _read_in_other_group(self, node: fx.Node, output: int, groups: Mapping[str, Any]) -> bool:
        """Whether an op of another group than ``node``'s reads its output ``output``."""
        parts = [u for u in node.users if u.target is operator.getitem and u.args[1] == output]
        readers = [user for value in parts or [node] for user in self._readers(value)]
        return any(
            groups[user.name] != groups[node.name] for user in readers if user.target is not operator.getitem
        )

    def _work(self) -> list[StageWork]:
        """Per stage: its entries, what it receives and sends, when each value goes."""
        stages = len(self.stages)
        work = [StageWork() for _ in range(stages)]
        backward_start = self.graph.backward_start
        position = {node: i for i, node in enumerate(self.graph.order)}
        for entry in self.inner.entries:
            stage = work[self.stage_of[entry.node]]
            if not entry.again and position[entry.node] < backward_start:
                stage.entries[FORWARD].append(entry)
            elif not entry.again and entry.node.name in self.weight_ops:
                stage.entries[WEIGHT].append(entry)
            else:  # a recomputation runs with B, before any reader
                stage.entries[BACKWARD].append(entry)
        for node in self.graph.order:
            made = self.stage_of[node]
            read = sorted(self._reading_stages(node) - {made})
            if not read:
                continue
            ahead, behind = crossed_cuts(made, read)
            if position[node] >= backward_start and ahead:
                raise PlanMismatch(f"pipeline: {node.name}, made in the backward, is read on a later stage")
            for cut in ahead:
                work[cut].sends[AHEAD].append(node)
                work[cut + 1].receives[AHEAD].append(node)
            for cut in behind:
                work[cut + 1].sends[BACK].append(node)
                work[cut].receives[BACK].append(node)
        for stage in work:
            self._lifetimes(stage)
        return work

    def _lifetimes(self, stage: StageWork) -> None:
        """When each value of the stage goes: after its last reader on the stage (the sends and the gradient
        accumulation read too), a value made again a new one (as :mod:`runtime.recomputation` counts)."""
        events: list[tuple[list[fx.Node], list[fx.Node]]] = [(stage.receives[AHEAD], [])]
        events += [([e.node], list(e.node.all_input_nodes)) for e in stage.entries[FORWARD]]
        events += [([], stage.sends[AHEAD] + [self.graph.loss]), (stage.receives[BACK], [])]
        events += [([e.node], list(e.node.all_input_nodes)) for e in stage.entries[BACKWARD]]
        events.append(([], stage.sends[BACK]))
        events += [([e.node], list(e.node.all_input_nodes)) for e in stage.entries[WEIGHT]]
        made_by: dict[fx.Node, int] = {}
        last: dict[tuple[fx.Node, int], int] = {}
        for index, (defines, reads) in enumerate(events):
            for source in reads:
                if source in made_by:
                    last[(source, made_by[source])] = index
            for node in defines:
                made_by[node] = index
                last.setdefault((node, index), index)
        drops: list[list[fx.Node]] = [[] for _ in events]
        for (node, _), index in last.items():
            drops[index].append(node)
        forward_end = 1 + len(stage.entries[FORWARD])
        backward_end = forward_end + 2 + len(stage.entries[BACKWARD])
        stage.drops = {
            FORWARD: drops[1:forward_end],
            BACKWARD: drops[forward_end + 2 : backward_end],
            WEIGHT: drops[backward_end + 1 :],
        }
        stage.after_sends = (drops[0] + drops[forward_end], drops[forward_end + 1] + drops[backward_end])

    def _shared(self) -> list[tuple[str, int, set[int]]]:
        """Each parameter read on stages of several ranks: its name, the rank making its gradient, the ranks
        holding it (its readers')."""
        shared = []
        for name, node in self.graph.parameters.items():
            holders = {stage % self.ranks for stage in self._reading_stages(node)}
            gradient = self.graph.gradients.get(name)
            maker = self.stage_of[gradient] % self.ranks if gradient is not None else None
            if maker is not None and holders - {maker}:
                shared.append((name, maker, holders))
        return shared

    # inputs ---------------------------------------------------------------------------------------------

    def _read_inputs(self) -> set[int]:
        """The step's inputs this rank's stages read."""
        return {k for k, node in enumerate(self.graph.inputs) if self._reading_stages(node) & set(self.own)}

    def distribute_inputs(self, inputs: Sequence[torch.Tensor]) -> list[list[DTensor | None]]:
        """Per micro-batch, the step's inputs this rank's stages read, in their planned placements (None for
        the others); the batch split along its first dim."""
        read = self._read_inputs()
        for k, tensor in enumerate(inputs):
            if tensor.shape[0] != self.microbatches * self.microbatch_size:
                raise ValueError(
                    f"input {k}: a batch of {tensor.shape[0]}; the pipeline runs {self.microbatches} "
                    f"micro-batches of {self.microbatch_size}"
                )
        placements = self.inner.input_placements
        return [
            [
                local_part(tensor, self.stage_mesh, placed) if k in read else None
                for k, (tensor, placed) in enumerate(zip(rows, placements, strict=True))
            ]
            for rows in microbatch_rows(list(inputs), self.microbatches)
        ]

    def input_slices(self) -> list[list[tuple[slice, ...]]]:
        """Per input of the step, this rank's part of each micro-batch, in the whole batch's rows (micro-batch
        ``i`` is rows ``i * size`` to ``(i + 1) * size``): a data loader gives it ``torch.cat([x[s] for s in
        slices])``; no slices for an input its stages do not read (the first stage's token ids on the
        last stage: it loads none of them)."""
        read = self._read_inputs()
        return [  # from its part of one micro-batch, on the stage mesh
            microbatch_slices(part, self.microbatches, self.microbatch_size) if k in read else []
            for k, part in enumerate(self.inner.input_slices())
        ]

    def assemble_inputs(self, parts: Sequence[torch.Tensor]) -> list[list[DTensor | None]]:
        """Per micro-batch, the step's inputs this rank's stages read, from this rank's parts of them as
        :meth:`input_slices` gives them (its parts of the micro-batches, one after another); an input its
        stages do not read is not looked at (an empty tensor will do)."""
        if len(parts) != len(self.graph.inputs):
            raise ValueError(f"inputs: the step takes {len(self.graph.inputs)} tensors, got {len(parts)}")
        assembled: list[list[DTensor | None]] = [[None] * len(parts) for _ in range(self.microbatches)]
        for k, (part, pieces) in enumerate(zip(parts, self.input_slices(), strict=True)):
            if not pieces:
                continue
            rows = [piece[0].stop - piece[0].start for piece in pieces]
            expected = [sum(rows), *(piece.stop - piece.start for piece in pieces[0][1:])]
            if list(part.shape) != expected:
                raise ValueError(
                    f"input {k}: this rank's part has shape {list(part.shape)}; the plan gives it "
                    f"{_rows_text(pieces)} of each micro-batch's rows, shape {expected} (`input_slices()` "
                    "says which)"
                )
            for i, piece in enumerate(torch.split(part, rows)):
                assembled[i][k] = self.inner.input_from_part(k, piece)
        return assembled

    # the step ---------------------------------------------------------------------------------------------

    @property
    def entries(self) -> list[Entry]:
        return [
            entry for stage in self.own for entries in self.work[stage].entries.values() for entry in entries
        ]

    @property
    def recomputed(self) -> list[fx.Node]:
        names = {node.name for node in self.inner.recomputed}
        return [entry.node for entry in self.entries if entry.again and entry.node.name in names]

    def __call__(
        self,
        parameters: Mapping[str, DTensor],
        buffers: Mapping[str, torch.Tensor],
        inputs: Sequence[Sequence[DTensor | None]],
    ) -> StepResult:
        """One step over the micro-batches in the schedule's order: the loss (every rank) and this rank's
        parameters' gradients, in the parameters' placements."""
        started = time.perf_counter()
        self.measured = PipelineMeasure()
        step = StepState()
        held: dict[fx.Node, Any] = {}
        for name, node in self.graph.parameters.items():
            if name in self.parameter_placements:
                held[node] = parameters[name]
        constants = {**buffers, **self.graph.constants}
        for name, node in self.graph.buffers.items():
            value = constants[name]
            held[node] = value if isinstance(value, DTensor) else self.inner.replicate(value)
        for value in held.values():
            step.live.add(value)
        step.draws = self._draw_states()
        if self.torch_stages is not None:
            self.torch_stages.run(held, inputs, step)
        else:
            self._run_in_order(held, inputs, step)
        gradients = {name: gradient / self.microbatches for name, gradient in step.gradients.items()}
        self._exchange(gradients)
        loss = self._loss(step.losses)
        self.measured.step_s = time.perf_counter() - started
        buffers = self.torch_stages.buffer_bytes() if self.torch_stages is not None else 0
        return StepResult(loss, gradients, step.deviations, step.live.peak + buffers)

    def forward_env(
        self, held: Mapping[fx.Node, Any], inputs: Sequence[DTensor | None], step: StepState
    ) -> dict[fx.Node, Any]:
        """A forward's values to start from: the held parameters and buffers, its micro-batch's inputs."""
        env = dict(held)
        for node, value in zip(self.graph.inputs, inputs, strict=True):
            if value is not None:
                env[node] = value
                step.live.add(value)
        return env

    def _run_in_order(
        self, held: Mapping[fx.Node, Any], inputs: Sequence[Sequence[DTensor | None]], step: StepState
    ) -> None:
        """The step in this module's own loop (where torch's stages cannot carry the plan:
        ``own_loop_because``): the schedule's actions in order, each receiving and sending what crosses its
        cut point to point."""
        envs: dict[tuple[int, int], dict[fx.Node, Any]] = {}
        idle = 0.0
        with torch.no_grad():
            for action in self.order:
                begun = time.perf_counter()
                key = (action.stage, action.microbatch)
                if action.kind == FORWARD:
                    envs[key] = self.forward_env(held, inputs[action.microbatch], step)
                self._act(action, envs[key], step)
                if action.kind == (WEIGHT if self.split else BACKWARD):  # the micro-batch's last
                    del envs[key]
                waited = self.measured.waited_s
                self.measured.spent(action, time.perf_counter() - begun - waited)
                self.measured.waited_s = 0.0
                idle += waited
            for work, _ in step.pending:
                work.wait()
        self.measured.waited_s = idle

    def _act(self, action: Action, env: dict[fx.Node, Any], step: StepState) -> None:
        """One forward, backward (or ``B``) or ``W`` of one stage on one micro-batch: receive what crosses the
        cut it reads over, run its ops (a backward adds up the gradients it makes), send what crosses the next
        cut (a ``W`` receives and sends nothing)."""
        stage = self.work[action.stage]
        direction, towards = (AHEAD, 1) if action.kind == FORWARD else (BACK, -1)
        if action.kind != WEIGHT:
            self.receive(
                Hop(stage.receives[direction], action.stage - towards, action, direction), env, step.live
            )
        self.compute(action, env, step)
        if action.kind == WEIGHT:
            return
        self.send(Hop(stage.sends[direction], action.stage + towards, action, direction), env, step.pending)
        self.drop(env, stage.after_sends[direction], step.live)

    def compute(self, action: Action, env: dict[fx.Node, Any], step: StepState) -> None:
        """An action's ops, what it received already in ``env``: each op in its planned placements (a random
        op drawing from its micro-batch's state), the gradients it makes added up, each value dropped after
        its last reader on the stage; a forward making the loss keeps it (replicated) in ``step.losses``."""
        stage = self.work[action.stage]
        for entry, drops in zip(stage.entries[action.kind], stage.drops[action.kind], strict=True):
            drawn_from = step.draws.get((entry.node, action.microbatch))
            with contextlib.nullcontext() if drawn_from is None else random_ops.drawing_from(drawn_from):
                env[entry.node] = self.inner._run(entry.node, env, step.deviations, step.live)
            step.live.add(env[entry.node])
            for name in () if entry.again else self.inner.gradient_of.get(entry.node, ()):
                gradient = redistribute(env[entry.node], self.inner.parameter_placements[name])
                if name in step.gradients:  # the micro-batches' gradients add up
                    step.live.remove(step.gradients[name])
                    gradient = step.gradients[name] + gradient
                step.gradients[name] = gradient
                step.live.add(gradient)
            self.drop(env, drops, step.live)
        if action.kind == FORWARD and self.graph.loss in env:
            replicated = redistribute(env[self.graph.loss], (Replicate(),) * self.stage_mesh.ndim)
            step.losses.append(replicated.to_local())

    def _draw_states(self) -> dict[tuple[fx.Node, int], Any]:
        """Where each forward random op draws from on each micro-batch: the generator state one process has
        there, training on the micro-batches one after another (each forward's draws in the graph's order).
        Found by drawing them so, over stand-ins (:func:`runtime.random_ops.draw_over_stand_ins`), every rank
        alike; the generator is left where one process leaves it. A forward and its recomputation then draw
        from their micro-batch's state, whatever the schedule's order and whichever rank runs the op."""
        device = torch.device(self.stage_mesh.device_type)
        states = {}
        for microbatch in range(self.microbatches if self.drawing else 0):
            for node in self.drawing:
                states[(node, microbatch)] = random_ops.generator_state(device.type)
                random_ops.draw_over_stand_ins(node, device)
        return states

    @staticmethod
    def drop(env: dict[fx.Node, Any], nodes: Sequence[fx.Node], live: LiveBytes) -> None:
        for node in nodes:
            if node in env and node.op != "placeholder":
                gone = env.pop(node)
                release_mask(gone)
                live.remove(gone)

    # point to point ----------------------------------------------------------------------------------------

    def _peer(self, stage: int) -> int:
        """The global rank at this rank's stage-mesh coordinate on ``stage``'s slice of the pp axis."""
        coordinate = self.mesh.get_coordinate()
        assert coordinate is not None
        return int(self.mesh.mesh[(stage % self.ranks, *coordinate[1:])].item())

    def _tag(self, action: Action, direction: int, cut: int, index: int) -> int:
        """One tag per value, cut, direction and micro-batch: the receiver matches each send by it."""
        return ((action.microbatch * 2 + direction) * len(self.stages) + cut) * self.widest + index

    def planned(self, node: fx.Node) -> Placements:
        source, k = (node.args[0], node.args[1]) if node.target is operator.getitem else (node, 0)
        spec = self.inner.nodes[source.name].outputs[k]  # type: ignore[union-attr]
        assert spec is not None, f"{node.name} is not a tensor"
        return tuple(to_dtensor(spec))

    def piece(self, env: Mapping[fx.Node, Any], node: fx.Node) -> torch.Tensor:
        """This rank's piece of ``node``'s value, in its planned placements: what goes over a cut."""
        value = env[node]
        if not isinstance(value, DTensor):
            raise PlanMismatch(f"pipeline: {node.name}, read on another stage, is not a tensor")
        return redistribute(value, self.planned(node)).to_local().contiguous()

    def send(self, hop: Hop, env: dict[fx.Node, Any], pending: list[Any]) -> None:
        for index, node in enumerate(hop.nodes):
            local = self.piece(env, node)
            tag = self._tag(hop.action, hop.direction, hop.cut, index)
            pending.append((self._send_piece(local, self._peer(hop.stage), tag), local))

    def receive(self, hop: Hop, env: dict[fx.Node, Any], live: LiveBytes) -> None:
        for index, node in enumerate(hop.nodes):
            tag = self._tag(hop.action, hop.direction, hop.cut, index)
            env[node] = self._receive_piece(node.meta["val"], self.planned(node), self._peer(hop.stage), tag)
            live.add(env[node])

    def _send_piece(self, local: torch.Tensor, rank: int, tag: int) -> Any:
        """``local`` sent to the global ``rank`` (not waited for: the work is returned), its bytes counted."""
        self.measured.sent_bytes += local.numel() * local.element_size()
        return dist.isend(local, dst=rank, group=self.group, tag=tag)

    def _receive_piece(self, meta: torch.Tensor, placements: Placements, rank: int, tag: int) -> DTensor:
        """This rank's piece, in ``placements``, of a value shaped as ``meta``, from the global ``rank``
        (waited for: the wait is idle time)."""
        buffer = torch.empty(
            self.local_shape(meta, placements), dtype=meta.dtype, device=self.stage_mesh.device_type
        )
        waiting = time.perf_counter()
        dist.irecv(buffer, src=rank, group=self.group, tag=tag).wait()
        self.measured.waited_s += time.perf_counter() - waiting
        return self.piece_as_dtensor(buffer, meta, placements)

    def local_shape(self, meta: torch.Tensor, placements: Placements) -> tuple[int, ...]:
        """This rank's piece's shape of a value shaped as ``meta`` in ``placements`` on the stage mesh."""
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        shape, _ = compute_local_shape_and_global_offset(meta.shape, self.stage_mesh, placements)
        return tuple(shape)

    def piece_as_dtensor(self, local: torch.Tensor, meta: torch.Tensor, placements: Placements) -> DTensor:
        """This rank's piece ``local`` of a value shaped as ``meta``, in ``placements`` on the stage mesh."""
        return DTensor.from_local(
            local,
            self.stage_mesh,
            placements,
            run_check=False,
            shape=meta.shape,
            stride=_contiguous(meta.shape),
        )

    def _exchange(self, gradients: dict[str, DTensor]) -> None:
        """Each shared parameter's gradient, from the rank making it to every other holder (point to point, at
        this rank's stage-mesh coordinate: its local piece in the parameter's placements)."""
        after_every_microbatch = (self.microbatches * 2 + 2) * len(self.stages) * self.widest
        sends = []
        for index, (name, maker, holders) in enumerate(self.shared):
            tag = after_every_microbatch + index
            if self.rank == maker:
                local = gradients[name].to_local().contiguous()
                sends += [
                    self._send_piece(local, self._peer(rank), tag) for rank in sorted(holders - {maker})
                ]
                if maker not in holders:  # made here for ranks that hold it
                    del gradients[name]
            elif self.rank in holders:
                meta = self.graph.gradients[name].meta["val"]
                placements = self.inner.parameter_placements[name]
                gradients[name] = self._receive_piece(meta, placements, self._peer(maker), tag)
        for work in sends:
            work.wait()

    def _loss(self, losses: list[torch.Tensor]) -> DTensor:
        """The mean of the micro-batches' losses, sent from the last stage's rank to every other rank (point
        to point: no collective the plan does not have)."""
        last = (len(self.stages) - 1) % self.ranks
        dtype = self.graph.loss.meta["val"].dtype
        loss = torch.stack(losses).mean() if losses else torch.zeros((), dtype=dtype)
        loss = loss.to(self.stage_mesh.device_type)
        tag = self._tag(Action(FORWARD, 0, self.microbatches), AHEAD, 0, 0)
        if self.rank == last:
            sends = [
                dist.isend(loss, dst=self._peer(rank), group=self.group, tag=tag)
                for rank in range(self.ranks)
                if rank != last
            ]
            for work in sends:
                work.wait()
        else:
            dist.irecv(loss, src=self._peer(last), group=self.group, tag=tag).wait()
        return DTensor.from_local(
            loss, self.stage_mesh, [Replicate()] * self.stage_mesh.ndim, run_check=False
        )

    def predicted_sent_bytes(self, plan: Mapping[str, Any]) -> float:
        """What the plan says this rank sends in one step: its stages' forward sends over the cut after each,
        backward sends over the cut before, every micro-batch; the shared parameters' gradients it makes."""
        cuts = [stage["send_bytes"] for stage in plan["pipeline"]["stages"]]
        per_microbatch = sum(
            (cuts[s][0] if s < len(cuts) - 1 else 0.0) + (cuts[s - 1][1] if s > 0 else 0.0) for s in self.own
        )
        exchanged = sum(
            e["bytes"] * len(e["to_stages"])
            for e in plan["pipeline"].get("exchanges", [])
            if e["from_stage"] in self.own
        )
        return per_microbatch * self.microbatches + exchanged

    def predicted_collectives(self, plan: Mapping[str, Any]) -> tuple[dict[str, int], int] | None:
        """What the plan says this rank runs in one step: its stages' collectives, every micro-batch, and
        their bytes (None: a plan made before stages counted them)."""
        counts: dict[str, int] = {}
        stages = [plan["pipeline"]["stages"][s] for s in self.own]
        if any("collectives" not in stage for stage in stages):
            return None
        for stage in stages:
            for kind, count in stage["collectives"].items():
                counts[kind] = counts.get(kind, 0) + count * self.microbatches
        return counts, sum(stage["comm_bytes"] for stage in stages) * self.microbatches


def _rows_text(pieces: Sequence[tuple[slice, ...]]) -> str:
    return ", ".join(f"{piece[0].start}:{piece[0].stop}" for piece in pieces)


def _contiguous(shape: Sequence[int]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def stage_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """The mesh of this rank's stage: the axes after ``pp``."""
    names = mesh.mesh_dim_names
    if names is None or mesh.ndim < 2:
        raise PlanMismatch("pipeline: the mesh needs a named pp axis and the stage's axes after it")
    return mesh[names[1:]] if len(names) > 2 else mesh[names[1]]


__all__ = ["PipelineMeasure", "PipelineStep", "stage_mesh"]
