"""A plan's cost per transformer layer, and the pipeline it predicts when its layers are cut into stages.

Issue 28's pipeline axis, second piece (after :mod:`strategies.plan.pipeline`'s schedule simulator): every
stage of a pipeline runs the same placements on the mesh's other axes (identical layers share decisions), so
one plan of the whole model on those axes, at the size of one micro-batch, gives what each stage costs:

- :func:`layer_profile` splits the plan's step by layer: each op's compute and the redistributions into it
  (their seconds as the plan runs them, :func:`strategies.plan.plan_json.plan_moves`) go to the op's layer,
  forward or backward by where the op sits on the step's timeline; ops outside every layer go to the first
  stage (before the first layer in the forward, after the last in the backward: the embedding) or the last
  (the final norm, the output head and the loss). The middle copies of a layer repeat stand for the layers
  left out (:mod:`strategies.problem.layer_repeat`): their weighted sums are shared evenly among the middle
  layers of the full stack. The seconds are then scaled so that, all layers together, they make the plan's
  simulated step (its two-stream schedule's verdict on what overlaps stays). Per layer too: the activation
  bytes its forward leaves for its backward (the values alive across the start of the backward), its
  parameters' bytes (with their gradients and optimizer state) and, for a zero-bubble schedule, the part of
  its backward making only parameters' gradients (``W``: its seconds, and the bytes of the kept activations
  and backward values ``W`` reads, which its ``B`` leaves alive), and the collectives its redistributions run
  (a value an op of another layer reads moved for each reader: a stage may hand it over a cut as made).
- :func:`predict_pipeline` cuts the layers into stages (:func:`~strategies.plan.pipeline.balance`), prices the
  sends between neighbouring stages (every value read beyond the cut, in its planned placement, handed on
  stage to stage: the residual stream and what every layer reads, forward; their gradients, backward; over
  the link between the stages' ranks), simulates the schedule over the micro-batches and gives the step, each
  stage's bubble and each stage's peak memory: its parameters' share, the activations of the micro-batches it
  holds at once, the plan's working memory at its peak (what it holds beyond parameters and kept
  activations) and the receive buffers torch's ``PipelineStage`` keeps for every micro-batch.

A parameter read by ops of stages on two ranks of the pipeline axis (GPT-2's embedding, tied to its output
head) is held on each (its memory, with its optimizer state, counted on both); its gradient is made on one
(where its contributions add up: the micro-batches' contributions of the other stage reach it as any value
read beyond a cut does) and sent once per step, at its end, to every other holder, which then steps its
optimizer on the same gradient (Megatron-LM's embedding group does it with an all-reduce of two partial
sums; here it is one send per holder, priced over the stages' link and added to the step).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from strategies.cost.comm import local_numel
from strategies.cost.hardware import Link as HardwareLink
from strategies.plan.pipeline import Link, StageCost, balance, simulate
from strategies.problem.builder import PARAMETER_KINDS, BuiltProblem
from strategies.problem.stage_groups import FIRST, LAST, Group, crossed_cuts, stage_of_group

ACTIVATION_KINDS = ("op", "kept", "held")


@dataclass(frozen=True)
class LayerCost:
    forward_s: float
    backward_s: float
    activation_bytes: float
    parameter_bytes: float
    weight_s: float = 0.0
    """Of ``backward_s``, the ops making only parameters' gradients (a zero-bubble schedule's ``W``)."""
    weight_bytes: float = 0.0
    """What a zero-bubble ``B`` leaves alive for its ``W``: the kept activations and the backward's values
    that ``W`` reads."""
    collectives: dict[str, float] = field(default_factory=dict)
    """The collectives its forward and backward run (the redistributions into its ops): how many of each."""
    comm_bytes: float = 0.0
    """Their bytes per device."""


@dataclass(frozen=True)
class Crossing:
    """A value read in other groups than the one making it (:mod:`strategies.problem.stage_groups`): those
    groups and its bytes per device. A pipeline hands it over every cut between them."""

    producer: Group
    readers: tuple[Group, ...]
    nbytes: float


@dataclass(frozen=True)
class SharedParameter:
    """A parameter read, or its gradient made, in more than one group: the groups reading it (its holders'),
    the one making its gradient, and its bytes per device: the parameter's (with its optimizer state) and
    its gradient's."""

    name: str
    groups: tuple[Group, ...]
    maker: Group
    counted: Group
    """The group whose stage the profile counts the parameter's memory on (its gradient's: ``maker``'s)."""
    parameter_bytes: float
    gradient_bytes: float


@dataclass(frozen=True)
class LayerProfile:
    """One micro-batch's step split by layer: ``layers`` of the full stack in order, and what runs outside
    every layer on the first stage (``first``) and on the last (``last``); ``crossings``: the values read
    outside their own layer (``captured``: the layers of the capture they name, the full stack's unless the
    capture repeats a layer for the others)."""

    layers: tuple[LayerCost, ...]
    first: LayerCost
    last: LayerCost
    crossings: tuple[Crossing, ...]
    captured: tuple[int, ...]
    working_bytes: float = 0.0
    """What the plan's peak holds beyond its parameters and the activations kept for the backward (values
    in flight at that moment: a layer's recomputation, gradients being made): a stage's peak has it too."""
    shared: tuple[SharedParameter, ...] = ()
    """The parameters read in more than one group (the module docstring's last paragraph)."""

    def cut_bytes(self, stages: list[range]) -> list[tuple[float, float]]:
        """Per cut between neighbouring ``stages`` (full-stack layers), the bytes per device one micro-batch
        sends over it: forward (activations) and backward (their gradients). A capture that repeats a layer
        for the others cuts as its first two layers cut, at every cut."""
        if len(stages) < 2:
            return []
        if len(self.captured) < len(self.layers):
            first, rest = self.captured[0], self.captured[1:]
            return self._crossed([range(first, first + 1), range(rest[0], rest[-1] + 1)]) * (len(stages) - 1)
        return self._crossed(stages)

    def _crossed(self, stages: list[range]) -> list[tuple[float, float]]:
        forward = [0.0] * (len(stages) - 1)
        backward = [0.0] * (len(stages) - 1)
        for crossing in self.crossings:
            made = stage_of_group(crossing.producer, stages)
            read = [stage_of_group(group, stages) for group in crossing.readers]
            ahead, behind = crossed_cuts(made, read)
            for cut in ahead:
                forward[cut] += crossing.nbytes
            for cut in behind:
                backward[cut] += crossing.nbytes
        return list(zip(forward, backward, strict=True))


def layer_profile(
    built: BuiltProblem, chosen: np.ndarray, step_time_s: float, peak_bytes: float | None = None
) -> LayerProfile:
    """The profile of the module docstring for the plan ``chosen`` of ``built`` whose simulated step is
    ``step_time_s`` and whose predicted peak is ``peak_bytes`` (its ``predicted``)."""
    from strategies.plan.plan_json import moved_once, plan_moves

    if built.node_layer is None or built.backward_start is None or built.op_group is None:
        raise ValueError("pipeline: the graph has no module paths, so its layers cannot be cut into stages")
    layer_of, back, op_group = built.node_layer, built.backward_start, built.op_group
    captured = sorted({layer for layer in layer_of if layer is not None})
    if len(captured) < 2:
        raise ValueError("pipeline: the model has fewer than two layers to cut into stages")
    starts = [built.problem.intervals[i][0] for i in range(len(built.nodes))]
    layer_positions = [
        starts[i] for i, n in enumerate(built.nodes) if n.kind == "op" and layer_of[i] is not None
    ]
    first_forward = min(p for p in layer_positions if p <= back)
    last_backward = max(p for p in layer_positions if p > back)
    weight = built.node_weights()
    keys = [*captured, FIRST, LAST]
    fwd, bwd, act, par, wgt, wbytes = ({key: 0.0 for key in keys} for _ in range(6))
    weight_ops, read_by_weight = built.weight_ops, built.read_by_weight_ops
    counted = 0.0  # the parameters' and the left-out layers' memory as the plan counts it
    # a parameter's first reader, a gradient's maker: the op whose stage holds it
    neighbour: dict[int, int] = {}
    for edge in built.edges:
        if built.nodes[edge.producer].kind in PARAMETER_KINDS:
            neighbour.setdefault(edge.producer, edge.consumer)
        if built.nodes[edge.consumer].kind in PARAMETER_KINDS:
            neighbour.setdefault(edge.consumer, edge.producer)

    def group(i: int) -> Group:
        if built.nodes[i].kind == "op":
            return op_group[built.nodes[i].name]
        if layer_of[i] is not None:
            return layer_of[i]  # type: ignore[return-value]
        if i in neighbour and built.nodes[neighbour[i]].kind == "op":
            return op_group[built.nodes[neighbour[i]].name]
        forward = starts[i] <= back
        return (
            FIRST
            if (forward and starts[i] < first_forward) or (not forward and starts[i] > last_backward)
            else LAST
        )

    counted_in: dict[str, Group] = {}  # each parameter's group
    for i, node in enumerate(built.nodes):
        key = group(i)
        if node.kind == "parameter":
            counted_in[node.name] = key
        if node.kind == "op":
            seconds = float(weight[i] * node.compute_s[chosen[i]])
            (fwd if starts[i] <= back else bwd)[key] += seconds
            wgt[key] += seconds if node.name in weight_ops else 0.0
        start, end = built.problem.intervals[i]
        nbytes = float(node.memory_bytes[chosen[i]])
        if node.kind in (*PARAMETER_KINDS, "ghost"):  # a ghost: the left-out layers' share of a value
            counted += nbytes
        if node.kind in PARAMETER_KINDS:
            par[key] += nbytes / built.parameter_memory_share  # the whole parameter, not a stage's share
        elif node.kind in ACTIVATION_KINDS and (start <= back < end or start > back):
            read_by_w = (node.held_for or node.name) in read_by_weight and node.name not in weight_ops
            act[key] += nbytes if start <= back else 0.0
            wbytes[key] += nbytes if read_by_w else 0.0
    read_elsewhere = _read_in_other_groups(built, op_group)
    # a value another group's op reads may go over a cut as made: moved for each reader, not once
    # (:mod:`runtime.pipeline_step` alike)
    moves = plan_moves(built, chosen, moved_once(built, chosen) - set(read_elsewhere))
    collectives: dict[Group, dict[str, float]] = {key: {} for key in keys}
    comm_bytes = {key: 0.0 for key in keys}
    for e, counts in moves.edge_collectives.items():
        key = group(built.edges[e].consumer)
        comm_bytes[key] += moves.edge_bytes[e]
        for kind, count in counts.items():
            collectives[key][kind] = collectives[key].get(kind, 0.0) + count
    for move in moves.moves:
        consumer = built.edges[move.edge].consumer
        key = group(consumer)
        (fwd if starts[consumer] <= back else bwd)[key] += move.seconds
        wgt[key] += move.seconds if built.nodes[consumer].name in weight_ops else 0.0
    for consumer, seconds in moves.closure_s.items():
        bwd[group(consumer)] += seconds
    total = sum(fwd.values()) + sum(bwd.values())
    scale = step_time_s / total if total > 0 else 1.0
    full = built.repeat.total if built.repeat is not None else len(captured)
    middle = captured[1:-1]
    share = (full - 2) / len(middle) if middle and built.repeat is not None else 1.0

    def cost(key: int | str, weight: float = 1.0) -> LayerCost:
        # a middle copy's seconds are weighted for the layers it stands for; its bytes are one layer's (the
        # ghosts hold the left-out layers' and are not counted here)
        return LayerCost(
            fwd[key] * scale / weight,
            bwd[key] * scale / weight,
            act[key],
            par[key],
            wgt[key] * scale / weight,
            wbytes[key],
            {kind: count / weight for kind, count in collectives[key].items()},
            comm_bytes[key] / weight,
        )

    layers = [cost(captured[0])]
    layers += [cost(middle[j % len(middle)], share) for j in range(full - 2)] if middle else []
    layers.append(cost(captured[-1]))
    held = sum(act.values())  # the captured layers' (the ghosts hold the others')
    working = max(0.0, peak_bytes - counted - held) if peak_bytes is not None else 0.0
    return LayerProfile(
        tuple(layers),
        cost(FIRST),
        cost(LAST),
        _crossings(built, chosen, op_group, read_elsewhere),
        tuple(captured),
        working,
        _shared(built, chosen, op_group, counted_in),
    )


def _shared(
    built: BuiltProblem, chosen: np.ndarray, op_group: dict[str, Group], counted_in: dict[str, Group]
) -> tuple[SharedParameter, ...]:
    """The parameters read, or whose gradient is made, in more than one group, with their bytes per device
    (the whole parameter's, not the program's ``1/p`` share of it); ``counted_in``: the group each
    parameter's memory is counted in."""
    groups: dict[str, set[Group]] = {}
    makers: dict[str, Group] = {}
    for edge in built.edges:
        producer, consumer = built.nodes[edge.producer], built.nodes[edge.consumer]
        if producer.kind == "parameter" and consumer.kind == "op":
            groups.setdefault(producer.name, set()).add(op_group[consumer.name])
        if consumer.kind == "gradient" and producer.kind == "op":
            makers[consumer.name.removesuffix(".grad")] = op_group[producer.name]
    nbytes = {
        node.name: float(node.memory_bytes[chosen[i]]) / built.parameter_memory_share
        for i, node in enumerate(built.nodes)
        if node.kind in PARAMETER_KINDS
    }
    shared = []
    for name, read in groups.items():
        maker = makers.get(name)
        if maker is None or len(read | {maker}) < 2:
            continue
        gradient = nbytes.get(f"{name}.grad", 0.0)
        readers = tuple(sorted(read, key=str))
        shared.append(SharedParameter(name, readers, maker, counted_in[name], nbytes[name], gradient))
    return tuple(shared)


def _read_in_other_groups(
    built: BuiltProblem, op_group: dict[str, Group]
) -> dict[tuple[int, int], set[Group]]:
    """Per op output read by an op of another group than its maker's, (producer, output): those groups."""
    readers: dict[tuple[int, int], set[Group]] = {}
    for edge in built.edges:
        producer, consumer = built.nodes[edge.producer], built.nodes[edge.consumer]
        if producer.kind != "op" or consumer.kind != "op":
            continue
        made, read = op_group[producer.name], op_group[consumer.name]
        if made != read:
            readers.setdefault((edge.producer, edge.output), set()).add(read)
    return readers


def _crossings(
    built: BuiltProblem,
    chosen: np.ndarray,
    op_group: dict[str, Group],
    readers: dict[tuple[int, int], set[Group]],
) -> tuple[Crossing, ...]:
    """Every op output read by an op of another group (``readers``: :func:`_read_in_other_groups`), in its
    chosen placement (what a stage sends)."""
    crossings = []
    for (index, output), groups in readers.items():
        node = built.nodes[index]
        meta = node.outputs[output]
        assert meta is not None
        spec = tuple(int(code) for code in node.output_specs[chosen[index], output])
        nbytes = local_numel(tuple(meta.shape), spec, built.mesh.shape) * meta.itemsize
        order = sorted(groups, key=str)
        crossings.append(Crossing(op_group[node.name], tuple(order), float(nbytes)))
    return tuple(crossings)


def stage_link(built: BuiltProblem, stages: int) -> Link:
    """The link between neighbouring stages' ranks: the pipeline axis outermost, ``stages`` copies of the
    plan's mesh; over InfiniBand where the stages together span more than a node."""
    hardware = built.mesh.hardware
    link: HardwareLink = (
        hardware.inter_node if stages * built.mesh.size > hardware.node_size else hardware.intra_node
    )
    return Link(link.bandwidth, link.latency)


@dataclass(frozen=True)
class PipelinePrediction:
    stages: tuple[range, ...]
    """Each stage's layers of the full stack, in model order; stage ``s`` runs on the ``s mod p``-th slice
    of the pipeline axis (``chunks`` stages per slice)."""
    schedule: str
    microbatches: int
    chunks: int
    step_s: float
    bubble_s: tuple[float, ...]
    """Per slice of the pipeline axis (a rank group): the step less its busy time."""
    peak_bytes: tuple[float, ...]
    """Per slice: its stages' parameters (with their gradients and optimizer state), the activations it
    holds at its peak, and the receive buffers torch's stages keep for every micro-batch."""
    send_bytes: float
    cut_bytes: tuple[tuple[float, float], ...] = ()
    """Per cut between stages ``k`` and ``k + 1``: what one micro-batch sends over it per device, forward and
    backward."""
    exchanges: tuple[Exchange, ...] = ()
    """The shared parameters' gradients sent once per step (the module docstring's last paragraph)."""
    stage_costs: tuple[StageCost, ...] = ()
    """Per stage, one micro-batch's seconds (forward, backward, of it the parameters' gradients) and bytes."""
    collectives: tuple[dict[str, int], ...] = ()
    """Per stage, the collectives one micro-batch runs on each of its devices: how many of each kind."""
    comm_bytes: tuple[int, ...] = ()
    """Per stage, their bytes per device."""


def predict_pipeline(
    profile: LayerProfile, ranks: int, microbatches: int, schedule: str, link: Link, chunks: int = 1
) -> PipelinePrediction:
    """The step of ``microbatches`` micro-batches over ``ranks`` slices of the pipeline axis holding
    ``chunks`` stages each (more than one: ``interleaved-1f1b``) in ``schedule``: the layers cut into
    ``ranks x chunks`` stages balancing their forward and backward seconds (the first and last stages'
    extras counted)."""
    layer_s = [layer.forward_s + layer.backward_s for layer in profile.layers]
    first_s = profile.first.forward_s + profile.first.backward_s
    last_s = profile.last.forward_s + profile.last.backward_s
    cuts = balance(layer_s, ranks * chunks, first_s, last_s)
    sends = profile.cut_bytes(cuts)
    costs: list[StageCost] = []
    collectives: list[tuple[dict[str, int], int]] = []
    parameters = [0.0] * ranks
    for k, layers in enumerate(cuts):
        parts = [profile.layers[i] for i in layers]
        parts += [profile.first] if k == 0 else []
        parts += [profile.last] if k == len(cuts) - 1 else []
        collectives.append(_stage_collectives(parts))
        costs.append(
            StageCost(
                forward_s=sum(p.forward_s for p in parts),
                backward_s=sum(p.backward_s for p in parts),
                activation_bytes=sum(p.activation_bytes for p in parts),
                send_bytes=sends[k][0] if k < len(sends) else 0.0,
                gradient_bytes=sends[k][1] if k < len(sends) else 0.0,
                weight_s=sum(p.weight_s for p in parts),
                weight_bytes=sum(p.weight_bytes for p in parts),
            )
        )
        parameters[k % ranks] += sum(p.parameter_bytes for p in parts)
    exchanges = _exchanges(profile, cuts, ranks)
    for shared in profile.shared:  # held on every rank its groups' stages are on
        holders = {stage_of_group(group, cuts) % ranks for group in shared.groups}
        for rank in holders - {stage_of_group(shared.counted, cuts) % ranks}:
            parameters[rank] += shared.parameter_bytes
        for rank in holders - {stage_of_group(shared.maker, cuts) % ranks}:
            parameters[rank] += shared.gradient_bytes  # the gradient it receives
    # torch's PipelineStage allocates, once, a receive buffer for every micro-batch of every value coming over
    # each cut, forward and back (`_setup_forward_recv_info`, `_setup_backward_recv_info`), held for good
    received = [0.0] * ranks
    for k in range(len(cuts)):
        coming = (sends[k - 1][0] if k > 0 else 0.0) + (sends[k][1] if k < len(sends) else 0.0)
        received[k % ranks] += microbatches * coming
    step = simulate(costs, microbatches, schedule, [link] * (len(cuts) - 1), chunks)
    # the gradients go once the last backward has made them: the step waits for the slowest holder
    exchange_s = max((link.seconds(e.nbytes) * len(e.to_stages) for e in exchanges), default=0.0)
    return PipelinePrediction(
        stages=tuple(cuts),
        schedule=schedule,
        microbatches=microbatches,
        chunks=chunks,
        step_s=step.step_s + exchange_s,
        bubble_s=tuple(step.step_s + exchange_s - busy for busy in step.busy_s),
        peak_bytes=tuple(
            p + a + r + profile.working_bytes
            for p, a, r in zip(parameters, step.peak_activation_bytes, received, strict=True)
        ),
        send_bytes=step.send_bytes + sum(e.nbytes * len(e.to_stages) for e in exchanges),
        cut_bytes=tuple(sends),
        exchanges=tuple(exchanges),
        stage_costs=tuple(costs),
        collectives=tuple(counts for counts, _ in collectives),
        comm_bytes=tuple(nbytes for _, nbytes in collectives),
    )


def _stage_collectives(parts: list[LayerCost]) -> tuple[dict[str, int], int]:
    """A stage's collectives from its ``parts`` (its layers, the first's and last's extras), whole numbers (a
    middle copy standing for several layers counts their mean), and their bytes."""
    total: dict[str, float] = {}
    for part in parts:
        for kind, count in part.collectives.items():
            total[kind] = total.get(kind, 0.0) + count
    counts = {kind: round(count) for kind, count in sorted(total.items()) if round(count)}
    return counts, round(sum(part.comm_bytes for part in parts))


@dataclass(frozen=True)
class Exchange:
    """A shared parameter's gradient sent once per step from the stage making it to the stages on other ranks
    holding it (one per rank: its first stage there); ``nbytes`` per device."""

    name: str
    from_stage: int
    to_stages: tuple[int, ...]
    nbytes: float


def _exchanges(profile: LayerProfile, cuts: list[range], ranks: int) -> list[Exchange]:
    """Per shared parameter held on more than one rank, its gradient's sends: from its maker's stage to the
    first stage holding it on every other rank."""
    exchanges = []
    for shared in profile.shared:
        maker = stage_of_group(shared.maker, cuts)
        first_on_rank: dict[int, int] = {}
        for stage in sorted(stage_of_group(group, cuts) for group in shared.groups):
            first_on_rank.setdefault(stage % ranks, stage)
        others = tuple(stage for rank, stage in sorted(first_on_rank.items()) if rank != maker % ranks)
        if others:
            exchanges.append(Exchange(shared.name, maker, others, shared.gradient_bytes))
    return exchanges


__all__ = [
    "Crossing",
    "Exchange",
    "LayerCost",
    "LayerProfile",
    "PipelinePrediction",
    "SharedParameter",
    "layer_profile",
    "predict_pipeline",
    "stage_link",
]
