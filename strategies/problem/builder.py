"""From a captured training step to the solver's :class:`~solver.problem.Problem`.

Problem nodes (each with its strategy list, cost and memory per strategy):

- one per op node of the joint graph: its :class:`~strategies.ops.generate.OpStrategies`; cost ``compute_s``;
  memory: its outputs' local bytes, alive from the node to its last consumer (time = execution position);
  a view op's output shares its input's storage, so it counts from the next op on; a gradient is alive as the
  op's output only until its last use inside the step (its sink holds it from the next op on);
- one per parameter: every placement of the tensor (``R`` or ``S(d)`` per axis, no ``P``); it holds the
  parameter and its optimizer state (Adam: two moments in its dtype, sharded like the parameter) for the
  whole step;
- one *gradient sink* per parameter, grouped with it (same strategy index, so the gradient ends in the
  parameter's placement): its one incoming edge is the gradient's reduction (DDP's all-reduce, FSDP's
  reduce-scatter); it holds the gradient from its production to the end of the step;
- one per input and buffer placeholder: every placement; inputs are alive until their last use, and loading
  one costs its local bytes over the host-to-device link (``hardware.host_to_device``), so the plan names the
  placement a data loader should deliver (``S(0)`` on a data-parallel axis rather than ``R``);
- a loss sink with the single placement all-``R``: every rank needs the loss value.

Repeated transformer layers share decisions (:mod:`strategies.problem.layer_sharing`) when the step has module
paths and ``share_layers`` is on. With a ``recompute`` policy, a value a layer's backward reads may be kept or
made again (:mod:`strategies.problem.recompute`): its op's strategies repeat once per mode, and nodes grouped
with it hold its bytes over the parts of its life.

``operator.getitem`` nodes are folded into their producer (consumers read the producer's output ``k``).
Edges: per consumer tensor argument, the producer-output -> consumer-input redistribution matrix
(:meth:`OpStrategies.redistribute_from`); an edge into a value an op writes in place (or into a view on the
way to it) keeps its placement (:mod:`strategies.problem.in_place`). Costs are stored in microseconds
(``COST_UNIT_S``) so solver tolerances see numbers near one; memory in bytes.

**Overlap credit.** The objective stays linear: a collective a schedule can hide behind compute (a parameter's
gather or a gradient's reduction, by each edge's role, :mod:`strategies.problem.comm_roles`) is priced at
``1 - credit[role]`` of its time, where the credit is the share of that role the two-stream simulator hid in
the plan (:mod:`strategies.plan.schedule`) less what hiding costs the compute (``overlap_slowdown``); the
planner solves, simulates and re-credits (:func:`recredit`) until the credit holds. Activations' moves are
never credited: their readers wait for them.
"""

from __future__ import annotations

import copy
import itertools
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from solver.problem import FORBIDDEN_COST, Problem
from strategies.cost.comm import dim_pieces, local_sizes, redistribute_parts
from strategies.cost.comm_kernel import expand_into
from strategies.cost.mesh import Mesh
from strategies.ops.generate import op_strategies
from strategies.placement import NONE, R, Spec
from strategies.problem.comm_roles import ACTIVATION, GRADIENT, PARAMETER, StepRoles, step_roles
from strategies.problem.in_place import forbid_moves, placement_kept
from strategies.problem.layer_repeat import LayerRepeat, cost_weights, ghost_intervals
from strategies.problem.layer_sharing import layer_of, merge_groups, tied_layer_groups, tied_layers
from strategies.problem.recompute import (
    KEEP,
    RECOMPUTE,
    RECOMPUTE_DISPATCH_S,
    STORE,
    Candidate,
    Policy,
    available_rows,
    check_policy,
    find_candidates,
)
from strategies.problem.recompute import NONE as NO_RECOMPUTE
from strategies.problem.stage_groups import Group, op_groups, stage_paths, weight_gradient_ops
from strategies.tensor_meta import TensorMeta, flatten_outputs

if TYPE_CHECKING:
    from strategies.graph.capture import JointGraph

COST_UNIT_S = 1e-6
"""Problem costs are in microseconds."""
PARAMETER_KINDS = ("parameter", "gradient")
"""The nodes holding a parameter's memory (with its optimizer state) and its gradient's."""

ADAM_MOMENTS = 2
"""Optimizer state per parameter element: Adam's two moments, each in the parameter's dtype, as
``torch.optim.Adam``/``AdamW`` keep them (a bf16 parameter's moments are bf16: on one H200 the peak with
torch's AdamW was 7.2 GiB under the one with fp32 moments for 1.9 B bf16 parameters,
``benchmarks/step_calibration.py``)."""


@dataclass
class ProblemNode:
    """What a problem node stands for, to map the solution back."""

    name: str
    kind: str  # op | parameter | gradient | input | buffer | loss
    op: Any
    output_specs: np.ndarray  # [strategy, output, axis]
    input_specs: np.ndarray  # [strategy, tensor argument, axis]
    outputs: tuple[TensorMeta | None, ...]
    compute_s: np.ndarray
    memory_bytes: np.ndarray
    call: tuple[tuple, dict] | None = None
    """An op node's ``(args, kwargs)`` with tensors as :class:`TensorMeta` (global shapes), as
    ``op_strategies`` read them; ``None`` for other kinds."""
    rules: str = ""
    """Where an op node's strategies came from: ``autoshard`` rules, ``pytorch``'s DTensor rules, or
    ``replicate`` (no rule: all-replicate only)."""
    modes: np.ndarray | None = None
    """Per strategy, the mode of the op's outputs (:mod:`.recompute`: kept, recomputed in the backward or
    stored for recomputed readers); None for a node without a choice (kept)."""
    remake_s: np.ndarray | None = None
    """Per strategy, the seconds of ``compute_s`` that make the outputs again (:mod:`.recompute`)."""
    held_for: str = ""
    """A ``kept``/``held`` node's op: the part of its output's life it holds (:mod:`.recompute`)."""
    flops: np.ndarray | None = None
    """An op node's FLOPs per strategy (as counted, for model FLOPs utilisation); None for other kinds."""

    def recomputed(self, strategy: int) -> bool:
        """Whether an op node's ``strategy`` makes its outputs again in the backward."""
        return self.kind == "op" and self.modes is not None and int(self.modes[strategy]) == RECOMPUTE


@dataclass
class Edge:
    producer: int
    consumer: int
    output: int
    argument: int
    kind: str  # activation | parameter | gradient
    keeps_placement: bool = False
    """The consumer writes into the value (or into a view of it): no move (:mod:`.in_place`)."""


@dataclass
class BuiltProblem:
    problem: Problem
    nodes: list[ProblemNode]
    edges: list[Edge]
    mesh: Mesh
    parameter_nodes: dict[str, int]
    gradient_nodes: dict[str, int]
    input_nodes: list[int]
    timings: dict[str, float] = field(default_factory=dict)
    node_weight: np.ndarray | None = None
    """How many times each node's compute counts in the step (middle copies of a layer repeat), else 1."""
    edge_weight: np.ndarray | None = None
    """How many times each edge's redistribution counts in the step, else 1."""
    repeat: LayerRepeat | None = None
    credit: dict[str, float] = field(default_factory=dict)
    """Per edge role (``parameter``, ``gradient``), the share of its collectives' time the objective takes off
    (the module docstring)."""
    step: StepRoles | None = None
    """The step's ops in order and each edge's role (:mod:`strategies.problem.comm_roles`); made once, by the
    builder when it credits, else on first use."""

    def step_roles(self) -> StepRoles:
        if self.step is None:
            self.step = step_roles(self.nodes, self.edges, self.problem.intervals)
        return self.step

    def roles(self) -> list[str]:
        """Each edge's role."""
        return self.step_roles().roles

    recompute_edges: list[tuple[int, int]] = field(default_factory=list)
    """The problem's edges after `edges`: (closure op, recomputed op) pairs pricing the closure's compute,
    and (frontier value, recomputed op) pairs forbidding its absence (:mod:`strategies.problem.recompute`)."""
    recompute_closures: dict[int, tuple[int, ...]] = field(default_factory=dict)
    """Per op that may be recomputed, the ops of its closure (made again with it)."""
    node_layer: list[int | None] | None = None
    """Each node's captured layer by its own module path (`stage_groups.stage_paths`: the head and the final
    norm outside every layer, where the layer ties give them the last layer's), None outside every layer; None
    without module paths. What a pipeline's stages are cut by (:mod:`strategies.plan.stages`)."""
    op_group: dict[str, Group] | None = None
    """Each op's place in the stack of layers by name (:mod:`strategies.problem.stage_groups`); None without
    module paths or layers."""
    weight_ops: frozenset[str] = frozenset()
    """The backward ops making only parameters' gradients (a zero-bubble schedule's ``W``,
    :func:`strategies.problem.stage_groups.weight_gradient_ops`); empty without ``op_group``."""
    read_by_weight_ops: frozenset[str] = frozenset()
    """The values (by op name) a ``W`` op reads: a zero-bubble ``B`` leaves them alive for its ``W``."""
    backward_start: int | None = None
    """The timeline position where the backward begins (ops at or before it are the forward's)."""
    parameter_memory_share: float = 1.0
    """The share of parameter and gradient memory the problem counts (`build_problem`)."""

    def warnings(self) -> list[str]:
        """What the plan cannot do well, a line per cause: ops without a sharding rule (replicated)."""
        unplaced: dict[str, list[str]] = {}
        for node in self.nodes:
            if node.kind == "op" and node.rules == "replicate":
                unplaced.setdefault(str(node.op), []).append(node.name)
        return [
            f"no sharding strategy for {op}: {len(names)} node(s) replicated ({', '.join(names[:3])}"
            + (", ...)" if len(names) > 3 else ")")
            for op, names in sorted(unplaced.items())
        ]

    def unused_storage(self, chosen: np.ndarray) -> list[int]:
        """The nodes (and ghosts) holding stored values that no recomputation ``chosen`` makes reads: the
        program counts them anyway (:mod:`.recompute`), the plan does not."""
        if not self.recompute_edges:
            return []
        recomputed = {i for i, node in enumerate(self.nodes) if node.recomputed(int(chosen[i]))}
        readers: dict[str, set[int]] = {}
        for value, reader in self.recompute_edges:
            readers.setdefault(self.nodes[value].name, set()).add(reader)
        unused = {
            node.name
            for node in self.nodes
            if node.kind == "op"
            and node.modes is not None
            and (node.modes == STORE).all()
            and not readers.get(node.name, set()) & recomputed
        }
        holders = ("kept", "ghost")
        return [i for i, node in enumerate(self.nodes) if node.kind in holders and node.held_for in unused]

    def node_weights(self) -> np.ndarray:
        return np.ones(len(self.nodes)) if self.node_weight is None else self.node_weight

    def edge_weights(self) -> np.ndarray:
        return np.ones(len(self.edges)) if self.edge_weight is None else self.edge_weight


def tensor_placements(meta: TensorMeta, mesh: Mesh) -> np.ndarray:
    """Every ``R``/``S(d)`` spec of a tensor on the mesh (``[n, axes]``), all-``R`` first; a dim is only cut
    into at most as many pieces as it has elements."""
    codes = [R, *range(meta.ndim)]
    specs = np.array(list(itertools.product(codes, repeat=mesh.ndim)), dtype=np.int16).reshape(-1, mesh.ndim)
    fits = dim_pieces(specs, meta.ndim, mesh.shape) <= np.maximum(np.asarray(meta.shape, dtype=np.int64), 1)
    return specs[fits.all(axis=1)]


class _Builder:
    def __init__(self, mesh: Mesh, credit: Mapping[str, float]) -> None:
        self.mesh = mesh
        self.credit = dict(credit)
        self.nodes: list[ProblemNode] = []
        self.intervals: list[tuple[int, int]] = []
        self.edges: list[Edge] = []
        self.edge_parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        """Per edge: its redistribution table between distinct specs, the row of each producer strategy and
        the column of each consumer strategy (expanded once, by `edge_costs`)."""
        self.groups: list[tuple[int, int]] = []
        self.pins: dict[int, int] = {}
        self.step: StepRoles | None = None
        """The step's roles, when pricing the credit needed them."""

    def add_node(self, node: ProblemNode, start: int, end: int) -> int:
        self.nodes.append(node)
        self.intervals.append((start, end))
        return len(self.nodes) - 1

    def add_edge(
        self, producer: int, output: int, consumer: int, argument: int, kind: str, keep: bool = False
    ) -> None:
        p, c = self.nodes[producer], self.nodes[consumer]
        meta = p.outputs[output]
        assert meta is not None
        src = p.output_specs[:, output, :]
        dst = c.input_specs[:, argument, :]
        if (dst == NONE).all():
            return
        self.edges.append(Edge(producer, consumer, output, argument, kind, keep))
        self.edge_parts.append(redistribute_parts(self.mesh, meta.shape, meta.itemsize, src, dst))

    def edge_costs(
        self,
        weights: np.ndarray,
        extra: Sequence[tuple[int, int]] = (),
    ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Every edge's ``[producer strategy, consumer strategy]`` costs (the seconds of its redistribution,
        the credited share of parameter and gradient moves taken off, in `COST_UNIT_S`, times the edge's
        weight), written end to end into one array (the problem's, without a copy: 40 million costs on a
        3-D mesh); then zero matrices for the ``extra`` node pairs, in the same array."""
        sizes = [len(rows) * len(cols) for _table, rows, cols in self.edge_parts]
        counts = [len(node.compute_s) for node in self.nodes]
        extra_sizes = [counts[u] * counts[v] for u, v in extra]
        flat = np.empty(sum(sizes) + sum(extra_sizes))
        matrices: list[np.ndarray] = []
        start = 0
        if any(self.credit.values()):
            self.step = step_roles(self.nodes, self.edges, self.intervals)
        roles = self.step.roles if self.step is not None else [ACTIVATION] * len(sizes)
        for edge, role, (table, rows, cols), size, weight in zip(
            self.edges, roles, self.edge_parts, sizes, weights.tolist(), strict=True
        ):
            matrix = flat[start : start + size].reshape(len(rows), len(cols))
            factor = 1.0 - min(MAX_CREDIT, self.credit.get(role, 0.0))
            expand_into(table, rows, cols, factor, COST_UNIT_S, weight, matrix)
            if edge.keeps_placement:
                producer, consumer = self.nodes[edge.producer], self.nodes[edge.consumer]
                src = producer.output_specs[:, edge.output, :]
                forbid_moves(matrix, src, consumer.input_specs[:, edge.argument, :])
            matrices.append(matrix)
            start += size
        extra_matrices = []
        for (u, v), size in zip(extra, extra_sizes, strict=True):
            extra_matrices.append(flat[start : start + size].reshape(counts[u], counts[v]))
            extra_matrices[-1][:] = 0.0
            start += size
        return matrices, extra_matrices


def placeholder_node(
    name: str, kind: str, meta: TensorMeta, mesh: Mesh, extra_bytes_per_element: int = 0
) -> ProblemNode:
    """A parameter, gradient sink, input or buffer: every placement, no compute."""
    specs = tensor_placements(meta, mesh)
    numel = local_sizes(specs, meta.shape, mesh.shape).prod(axis=1)
    memory = numel * (meta.itemsize + extra_bytes_per_element)
    is_sink = kind == "gradient"
    return ProblemNode(
        name=name,
        kind=kind,
        op=None,
        output_specs=specs[:, None, :],
        input_specs=specs[:, None, :] if is_sink else np.zeros((len(specs), 0, mesh.ndim), dtype=np.int16),
        outputs=(meta,),
        compute_s=np.zeros(len(specs)),
        memory_bytes=memory,
    )


def input_load_s(node: ProblemNode, mesh: Mesh) -> np.ndarray:
    """Seconds each rank spends loading its part of an input from the host, per placement."""
    return node.memory_bytes / mesh.hardware.host_to_device


@dataclass(frozen=True)
class ProblemOptions:
    """How a step's problem is built, besides the step and the mesh (:func:`build_problem`)."""

    memory_limit: int | None = None
    """Bytes each device may hold at any moment (the memory rows' limit); None: no limit."""
    input_placements: Mapping[int, Spec] = field(default_factory=dict)
    """Pinned placements of inputs, by index into the step's inputs."""
    parameter_placements: Mapping[str, Spec] = field(default_factory=dict)
    """Pinned placements of parameters, by name (a captured one's, under a layer repeat)."""
    credit: Mapping[str, float] = field(default_factory=dict)
    """Per edge role (``parameter``, ``gradient``), the share of its collectives' time the objective takes
    off (the module docstring; :func:`first_credit`); at most `MAX_CREDIT` counts."""
    optimizer_state_bytes: int | None = None
    """Optimizer state per parameter element; None: Adam's two moments in the parameter's dtype
    (`ADAM_MOMENTS`)."""
    share_layers: bool = True
    """Whether repeated layers share decisions (:mod:`strategies.problem.layer_sharing`), where the step has
    module paths."""
    repeat: LayerRepeat | None = None
    """The step holds ``repeat.captured`` layers of a stack of ``repeat.total``
    (:mod:`strategies.problem.layer_repeat`); needs the step's module paths and ``share_layers``."""
    recompute: Policy = NO_RECOMPUTE
    """The recomputation policy (:mod:`strategies.problem.recompute`); without the step's module paths
    nothing is recomputed."""
    parameter_memory_share: float = 1.0
    """The share of each parameter's memory (with its optimizer state) and its gradient's that the memory
    rows count: a pipeline stage holds ``1/p`` of the layers (:mod:`strategies.plan.pipeline_plan`)."""


def build_problem(graph: JointGraph, mesh: Mesh, options: ProblemOptions = ProblemOptions()) -> BuiltProblem:
    """The whole-graph problem of one captured (or loaded) step on ``mesh`` (see the module docstring): its
    graph, parameters, gradients, inputs, buffers, loss, module paths and first backward op, built as
    ``options`` say."""
    import time

    started = time.perf_counter()
    b = _Builder(mesh, options.credit)
    step = _Timeline.of(graph)
    order, position, last_use, alive_until = step.order, step.position, step.last_use, step.alive_until
    end = len(order) + 2
    index_of: dict[torch.fx.Node, int] = {}
    parameter_nodes: dict[str, int] = {}
    input_nodes: list[int] = []

    role = {node: ("parameter", name) for name, node in graph.parameters.items()}
    role.update({node: ("buffer", name) for name, node in graph.buffers.items()})
    role.update({node: ("input", str(i)) for i, node in enumerate(graph.inputs)})
    for node in graph.gm.graph.nodes:
        if node.op != "placeholder" or not isinstance(node.meta.get("val"), torch.Tensor):
            continue
        kind, name = role.get(node, ("input", node.name))
        meta = TensorMeta.of(node.meta["val"])
        state = options.optimizer_state_bytes
        state = ADAM_MOMENTS * meta.itemsize if state is None else state
        extra = state if kind == "parameter" else 0
        pn = placeholder_node(name if kind != "input" else node.name, kind, meta, mesh, extra)
        if kind == "input":
            pn.compute_s = input_load_s(pn, mesh)
        alive = (0, end) if kind in ("parameter", "buffer") else (0, last_use[node] + 1)
        index_of[node] = b.add_node(pn, *alive)
        if kind == "parameter":
            parameter_nodes[name] = index_of[node]
        elif kind == "input":
            input_nodes.append(index_of[node])

    check_policy(options.recompute)
    paths, kept = step.paths, step.kept
    candidates = _step_candidates(step, options.recompute) if paths else {}

    strategies_s = time.perf_counter()
    for node in order:
        if node.target is operator.getitem:
            continue
        call = _op_call(node)
        strategies = op_strategies(
            node.target, call[0], call[1], mesh, outputs=flatten_outputs(node.meta["val"])
        )
        pn = ProblemNode(
            name=node.name,
            kind="op",
            op=node.target,
            output_specs=strategies.output_specs,
            input_specs=strategies.input_specs,
            outputs=strategies.outputs,
            compute_s=strategies.compute_s,
            memory_bytes=strategies.memory_bytes,
            call=call,
            rules=strategies.source,
            flops=strategies.flops,
        )
        born = position[node] + (1 if _is_view(node) else 0)
        if node in candidates:
            index_of[node] = _add_candidate(b, pn, candidates[node], born, alive_until[node] + 1)
        else:
            index_of[node] = b.add_node(pn, born, alive_until[node] + 1)
    strategies_s = time.perf_counter() - strategies_s

    edges_s = time.perf_counter()
    for node in order:
        if node.target is operator.getitem:
            continue
        consumer = index_of[node]
        for argument, source in enumerate(_tensor_sources(node)):
            if source is None:
                continue
            producer_node, output = source
            if producer_node not in index_of:
                raise ValueError(
                    f"graph: {node.name} ({node.target}) reads {producer_node.name} ({producer_node.op}), "
                    "which is neither an input, parameter, buffer nor op of the step"
                )
            kind = "parameter" if b.nodes[index_of[producer_node]].kind == "parameter" else "activation"
            keep = (node, argument) in kept
            b.add_edge(index_of[producer_node], output, consumer, argument, kind, keep)
    gradient_nodes: dict[str, int] = {}
    for name, grad_node in graph.gradients.items():
        source = _resolve(grad_node)
        param_index = parameter_nodes[name]
        meta = b.nodes[param_index].outputs[0]
        sink = placeholder_node(f"{name}.grad", "gradient", meta, mesh)
        start = position.get(source[0], 0) + 1  # the op's own output holds it at its production
        gradient_nodes[name] = b.add_node(sink, start, end)
        b.add_edge(index_of[source[0]], source[1], gradient_nodes[name], 0, "gradient")
        b.groups.append((param_index, gradient_nodes[name]))
    # every rank needs the loss value: it ends replicated
    source = _resolve(graph.loss)
    meta = b.nodes[index_of[source[0]]].outputs[source[1]]
    sink = placeholder_node("loss", "loss", meta, mesh)
    sink.output_specs = sink.output_specs[:1]
    sink.input_specs = sink.output_specs.copy()
    sink.compute_s, sink.memory_bytes = sink.compute_s[:1], sink.memory_bytes[:1]
    loss_index = b.add_node(sink, end - 1, end)
    b.add_edge(index_of[source[0]], source[1], loss_index, 0, "activation")
    edges_s = time.perf_counter() - edges_s

    for i, spec in options.input_placements.items():
        b.pins[input_nodes[i]] = _spec_index(b.nodes[input_nodes[i]], spec, f"inputs[{i}]")
    for name, spec in options.parameter_placements.items():
        if name not in parameter_nodes:
            raise ValueError(f"parameters.{name}: no such parameter")
        b.pins[parameter_nodes[name]] = _spec_index(
            b.nodes[parameter_nodes[name]], spec, f"parameters.{name}"
        )

    share = options.parameter_memory_share
    if share != 1.0:
        for node in b.nodes:
            if node.kind in PARAMETER_KINDS:
                node.memory_bytes = np.ceil(node.memory_bytes * share).astype(np.int64)
    node_weight = edge_weight = None
    repeat = options.repeat
    if options.share_layers and graph.module_path:
        ops = [(n.name, _signature(n), index_of[n]) for n in order if n.target is not operator.getitem]
        b.groups.extend(tied_layer_groups(ops, paths, parameter_nodes))
        if repeat is not None:
            node_weight, edge_weight = _repeat(b, repeat, ops, paths, graph.backward_start, end)
    elif repeat is not None:
        raise ValueError("layer repeat: needs the module paths of the graph and shared layers")
    node_scale = np.ones(len(b.nodes)) if node_weight is None else node_weight
    edge_scale = np.ones(len(b.edges)) if edge_weight is None else edge_weight
    recomputed = {index_of[n]: c for n, c in candidates.items() if RECOMPUTE in c.modes}
    extra = [(index_of[source], w) for w, c in recomputed.items() for source in (*c.closure, *c.frontier)]
    matrices, extra_matrices = b.edge_costs(edge_scale, extra)
    if candidates:
        by_index = {index_of[n]: c for n, c in candidates.items()}
        _price_recomputation(b, matrices, recomputed)
        _recomputation_terms(b, extra, extra_matrices, by_index, index_of, node_scale, step)
    problem = Problem.from_lists(
        costs=[n.compute_s / COST_UNIT_S * w for n, w in zip(b.nodes, node_scale.tolist(), strict=True)],
        usages=[n.memory_bytes for n in b.nodes],
        intervals=b.intervals,
        edges=[(e.producer, e.consumer) for e in b.edges] + extra,
        edge_costs=matrices + extra_matrices,
        usage_limit=options.memory_limit,
        groups=merge_groups(b.groups),
        pins=b.pins,
        name="autoshard",
    )
    built = BuiltProblem(problem, b.nodes, b.edges, mesh, parameter_nodes, gradient_nodes, input_nodes)
    built.node_weight, built.edge_weight, built.repeat = node_weight, edge_weight, repeat
    built.credit = {role: min(MAX_CREDIT, share) for role, share in options.credit.items()}
    built.step = b.step
    built.recompute_edges = extra
    built.recompute_closures = {w: tuple(index_of[n] for n in c.closure) for w, c in recomputed.items()}
    built.timings = {"strategies": strategies_s, "edges": edges_s, "total": time.perf_counter() - started}
    module_path, backward_start = graph.module_path, graph.backward_start
    built.node_layer = node_layers(b.nodes, stage_paths(order, module_path)) if module_path else None
    if built.node_layer and any(layer is not None for layer in built.node_layer):
        built.op_group = op_groups(order, module_path, backward_start)
        built.weight_ops = frozenset(weight_gradient_ops(order, backward_start, built.op_group))
        built.read_by_weight_ops = frozenset(
            (source.args[0] if source.target is operator.getitem else source).name  # type: ignore[union-attr]
            for node in order
            if node.name in built.weight_ops
            for source in node.all_input_nodes
        )
    built.parameter_memory_share = share
    built.backward_start = backward_start
    return built


def node_layers(nodes: Sequence[ProblemNode], paths: Mapping[str, str]) -> list[int | None]:
    """Each node's captured layer (``layers.<i>``, ``h.<i>``, ... of its op's module path, or of its
    parameter's or gradient's name), None outside every layer (embedding, final norm, output head, loss)."""
    layers: list[int | None] = []
    for node in nodes:
        name = node.name.removesuffix(".grad") if node.kind == "gradient" else node.held_for or node.name
        layers.append(layer_of(paths.get(name, "") if node.kind in ("op", "kept", "held") else name))
    return layers


def _add_candidate(b: _Builder, pn: ProblemNode, candidate: Candidate, born: int, end: int) -> int:
    """An op whose output's life the program chooses: one copy of its strategies per mode, its memory split
    over held nodes grouped with it (:mod:`strategies.problem.recompute`); returns the op's node."""
    copies = len(candidate.modes)
    modes = np.repeat(np.asarray(candidate.modes, dtype=np.int8), len(pn.compute_s))
    pn.output_specs = np.concatenate([pn.output_specs] * copies)
    pn.input_specs = np.concatenate([pn.input_specs] * copies)
    dispatch = RECOMPUTE_DISPATCH_S * (1 + len(candidate.closure))
    compute_s = np.tile(pn.compute_s, copies)
    pn.remake_s = np.where(modes == RECOMPUTE, compute_s + dispatch, 0.0)
    pn.compute_s = compute_s + pn.remake_s
    pn.memory_bytes = np.tile(pn.memory_bytes, copies)
    if pn.flops is not None:
        pn.flops = np.tile(pn.flops, copies)  # the model's FLOPs: a recomputation's are not counted again
    pn.modes = modes
    forward_end = max(born + 1, candidate.forward_last + 1)
    index = b.add_node(pn, born, forward_end)
    moment, usage = candidate.rematerialise, pn.memory_bytes
    if candidate.saved:
        parts = [
            ("kept", " (kept for the backward)", np.where(modes == KEEP, usage, 0), forward_end, moment),
            ("held", " (in the backward)", usage, moment, max(end, moment + 1)),
        ]
    else:  # a value the backward does not read, stored for recomputations
        stored = np.where(modes == STORE, usage, 0)
        parts = [("kept", " (stored for recomputation)", stored, forward_end, candidate.store_until + 1)]
    for kind, suffix, held_usage, start, stop in parts:
        if stop <= start or not held_usage.any():
            continue
        held = ProblemNode(
            name=pn.name + suffix,
            kind=kind,
            op=None,
            output_specs=pn.output_specs,
            input_specs=np.zeros((len(usage), 0, b.mesh.ndim), dtype=np.int16),
            outputs=pn.outputs,
            compute_s=np.zeros(len(usage)),
            memory_bytes=held_usage,
            modes=modes,
            held_for=pn.name,
        )
        b.groups.append((index, b.add_node(held, start, stop)))
    return index


def _price_recomputation(
    b: _Builder, matrices: list[np.ndarray], recomputed: Mapping[int, Candidate]
) -> None:
    """Into a recomputed strategy of an op: its arguments' redistributions once more (a parameter's
    all-gather too: the runtime, as FSDP resharded after the forward, gathers it again for the
    recomputation, and the backward then reads what that made)."""
    for edge, matrix in zip(b.edges, matrices, strict=True):
        modes = b.nodes[edge.consumer].modes
        if edge.consumer in recomputed and modes is not None and edge.kind != "gradient":
            matrix[:, modes == RECOMPUTE] *= 2.0


def _recomputation_terms(
    b: _Builder,
    pairs: list[tuple[int, int]],
    matrices: list[np.ndarray],
    candidates: Mapping[int, Candidate],
    index_of: Mapping[torch.fx.Node, int],
    node_scale: np.ndarray,
    step: _Timeline,
) -> None:
    """The `BuiltProblem.recompute_edges` of every recomputed op: a closure op's compute (on its strategy, in
    the op's recomputed strategies), ``inf`` where a frontier value is absent."""
    fx_of = {i: n for n, i in index_of.items()}
    for (u, w), matrix in zip(pairs, matrices, strict=True):
        consumer, producer = candidates[w], b.nodes[u]
        columns = b.nodes[w].modes == RECOMPUTE
        if fx_of[u] in consumer.closure:
            cost = producer.compute_s / COST_UNIT_S * node_scale[w]
            matrix[:, columns] = cost[:, None]
            continue
        rows = available_rows(
            candidates.get(u),
            producer.modes if producer.modes is not None else np.full(len(matrix), KEEP, dtype=np.int8),
            consumer,
            fx_of[u] in step.always_there,
            step.alive_until.get(fx_of[u], 0),
        )
        matrix[np.ix_(~rows, columns)] = np.inf


MAX_CREDIT = 0.9
"""The most of a collective's time the objective takes off: a plan never sees a collective as free."""


def first_credit(mesh: Mesh) -> dict[str, float]:
    """The credit a first solve prices with, before any plan was simulated: every parameter gather and
    gradient reduction hidden, at the cost the hardware's ``overlap_slowdown`` says hiding has."""
    share = min(MAX_CREDIT, 1.0 - mesh.hardware.overlap_slowdown)
    return {PARAMETER: share, GRADIENT: share}


def recredit(built: BuiltProblem, credit: Mapping[str, float]) -> BuiltProblem:
    """``built`` with its parameter and gradient edges priced under ``credit`` instead of its own (a new
    problem; nodes, edges and everything else shared). Forbidden costs stay forbidden."""
    costs = built.problem.edge_costs.copy()
    offsets = built.problem.edge_offsets
    for e, role in enumerate(built.roles()):
        old, new = built.credit.get(role, 0.0), min(MAX_CREDIT, credit.get(role, 0.0))
        if old == new:
            continue
        part = costs[offsets[e] : offsets[e + 1]]
        allowed = part < FORBIDDEN_COST
        part[allowed] *= (1.0 - new) / (1.0 - old)
    again = copy.copy(built)
    again.problem = built.problem.replace(edge_costs=costs)
    again.credit = {role: min(MAX_CREDIT, share) for role, share in credit.items()}
    return again


def step_candidates(graph: JointGraph, policy: Policy) -> dict[torch.fx.Node, Candidate]:
    """The recomputation candidates of a captured step under ``policy``, exactly as its problem has them
    (the runtime makes a plan's recomputed values again with their closures)."""
    return _step_candidates(_Timeline.of(graph), policy)


@dataclass(frozen=True)
class _Timeline:
    """What the builder reads off a captured step: its op nodes in execution order and when each value
    lives, its module paths with layers inherited, what is there the whole step, the edges keeping their
    placement."""

    order: list[torch.fx.Node]
    """The op nodes in execution order."""
    position: dict[torch.fx.Node, int]
    """Each op node's 1-based position."""
    last_use: dict[torch.fx.Node, int]
    """Each node's last reader's position: a gradient handed to its sink counts as read to the step's end."""
    alive_until: dict[torch.fx.Node, int]
    """`last_use`, looking through the ``getitem`` nodes of a node's outputs."""
    backward_start: int
    """The index in ``order`` of the first backward op."""
    paths: dict[str, str]
    """Module paths, layers inherited (`_inherit_layer_paths`); empty without the step's module paths."""
    always_there: set[torch.fx.Node]
    """The placeholders alive the whole step: parameters and buffers."""
    kept: set[tuple[torch.fx.Node, int]]
    """The (op, tensor argument) pairs whose edges keep their placement (:func:`.in_place.placement_kept`)."""

    @classmethod
    def of(cls, graph: JointGraph) -> _Timeline:
        order = [n for n in graph.gm.graph.nodes if n.op == "call_function"]
        position = {n: i + 1 for i, n in enumerate(order)}
        end = len(order) + 2
        handed_on = set(graph.gradients.values())  # the gradient sinks hold these from their production on
        last_use = {
            n: max(
                (position.get(u, end - 1) for u in n.users if u in position or n not in handed_on),
                default=position.get(n, 0),
            )
            for n in graph.gm.graph.nodes
        }
        alive_until = {
            n: _alive_until(n, last_use) if n in position else last_use[n] for n in graph.gm.graph.nodes
        }
        return cls(
            order=order,
            position=position,
            last_use=last_use,
            alive_until=alive_until,
            backward_start=graph.backward_start,
            paths=_inherit_layer_paths(order, graph.module_path),
            always_there={*graph.parameters.values(), *graph.buffers.values()},
            kept=placement_kept(order),
        )


def _step_candidates(step: _Timeline, policy: Policy) -> dict[torch.fx.Node, Candidate]:
    """`find_candidates` of a step, the ops writing into their arguments read from ``step.kept``."""
    sources = {node: _tensor_sources(node) for node, _ in step.kept}
    written = {(node, sources[node][k][0]) for node, k in step.kept if sources[node][k] is not None}
    return find_candidates(
        step.order,
        step.position,
        step.backward_start,
        step.paths,
        step.alive_until,
        step.always_there,
        written,
        policy,
    )


def _repeat(
    b: _Builder,
    repeat: LayerRepeat,
    ops: list[tuple[str, Any, int]],
    paths: Mapping[str, str],
    backward_start: int,
    step_end: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Weights for the middle copies of a layer repeat, and ghost nodes for the layers left out."""
    tied = tied_layers(ops, paths)
    if len(tied) != repeat.captured - 2:
        raise ValueError(
            f"layer repeat: the {repeat.captured - 2} middle layers of the capture are not identical "
            f"(tied: {tied}); plan the whole stack instead"
        )
    node_layer = node_layers(b.nodes, paths)
    node_weight, edge_weight = cost_weights(
        repeat, node_layer, [(e.producer, e.consumer) for e in b.edges], tied
    )
    members = [i for i, layer in enumerate(node_layer) if layer == tied[0]]
    op_starts = [b.intervals[i][0] for i in members if b.nodes[i].kind == "op"]
    forward_end = max(p for p in op_starts if p <= backward_start) + 1
    backward_begin = min(p for p in op_starts if p > backward_start)
    kinds = [n.kind for n in b.nodes]  # a `kept` part (recomputation's gap) always has a ghost
    if repeat.left_out > 0:
        for i, interval in ghost_intervals(
            b.intervals, kinds, members, forward_end, backward_begin, step_end
        ):
            node = b.nodes[i]
            ghost = ProblemNode(
                name=f"{node.name} (x{repeat.left_out} left-out layers)",
                kind="ghost",
                op=None,
                output_specs=node.output_specs,
                input_specs=np.zeros((len(node.output_specs), 0, b.mesh.ndim), dtype=np.int16),
                outputs=node.outputs,
                compute_s=np.zeros(len(node.output_specs)),
                memory_bytes=node.memory_bytes * repeat.left_out,
                held_for=node.held_for,
            )
            b.groups.append((i, b.add_node(ghost, *interval)))
    node_weight = np.concatenate([node_weight, np.zeros(len(b.nodes) - len(node_weight))])
    return node_weight, edge_weight


def tied_middle_layers(gm: torch.fx.GraphModule, module_path: Mapping[str, str]) -> list[int]:
    """The middle layers of a captured step that the problem ties (identical op sequences, see
    :mod:`strategies.problem.layer_sharing`): a layer repeat needs all but the first and last tied."""
    order = [n for n in gm.graph.nodes if n.op == "call_function"]
    ops = [(n.name, _signature(n), 0) for n in order if n.target is not operator.getitem]
    return tied_layers(ops, _inherit_layer_paths(order, module_path))


def _inherit_layer_paths(order: list[torch.fx.Node], module_path: Mapping[str, str]) -> dict[str, str]:
    """Module paths where nodes without a layer (gradient accumulation adds, casts autograd inserts)
    take the path of their first argument that has one of its own (else one it inherited), so they are
    tied with their layer too. (A chain of residual-gradient accumulations would otherwise pass the last
    layer's path down the whole backward pass.)"""
    paths = dict(module_path)
    for node in order:
        if layer_of(paths.get(node.name, "")) is not None:
            continue
        sources = node.all_input_nodes
        own = [s for s in sources if layer_of(module_path.get(s.name, "")) is not None]
        inherited = [s for s in sources if layer_of(paths.get(s.name, "")) is not None]
        if own or inherited:
            paths[node.name] = paths[(own or inherited)[0].name]
    return paths


def _signature(node: torch.fx.Node) -> tuple:
    """What makes two op nodes interchangeable: the op, its arguments' shapes and values, its outputs."""
    args, kwargs = _op_call(node)
    return (node.target, repr(args), repr(sorted(kwargs.items())), repr(flatten_outputs(node.meta["val"])))


def _spec_index(node: ProblemNode, spec: Spec, field_name: str) -> int:
    matches = np.flatnonzero((node.output_specs[:, 0, :] == np.asarray(spec)).all(axis=1))
    if not len(matches):
        from strategies.placement import spec_text

        raise ValueError(
            f"{field_name}: placement {spec_text(spec)} is not possible for shape {node.outputs[0]}"
        )
    return int(matches[0])


def _is_view(node: torch.fx.Node) -> bool:
    """Whether the op returns a view of an input (``t``, ``view``, ``transpose``, ``expand``, ...): its output
    shares the input's storage, so it holds new memory only from the next op on (where it carries the storage
    on for the input, whose own life ends at this op unless others read it later)."""
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return False
    return any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)


def _alive_until(node: torch.fx.Node, last_use: dict) -> int:
    """Last use of a node's outputs, looking through the getitem nodes that read them."""
    uses = [last_use[node]]
    uses += [last_use[u] for u in node.users if u.target is operator.getitem]
    return max(uses)


def _resolve(node: torch.fx.Node) -> tuple[torch.fx.Node, int]:
    """(producer, output index), looking through ``getitem``."""
    if node.op == "call_function" and node.target is operator.getitem:
        return node.args[0], int(node.args[1])
    return node, 0


def _tensor_sources(node: torch.fx.Node) -> list[tuple[torch.fx.Node, int] | None]:
    """Per flattened tensor argument (the order ``op_strategies`` uses): its producer and output index."""
    sources: list[tuple[torch.fx.Node, int] | None] = []

    def visit(value: Any) -> None:
        if isinstance(value, torch.fx.Node):
            val = value.meta.get("val")
            if isinstance(val, torch.Tensor):
                sources.append(_resolve(value))
            elif isinstance(val, (tuple, list)):
                for k, v in enumerate(val):
                    if isinstance(v, torch.Tensor):
                        sources.append((value, k))
        elif isinstance(value, (list, tuple)):
            for v in value:
                visit(v)
        elif isinstance(value, dict):
            for v in value.values():
                visit(v)

    visit(node.args)
    visit(node.kwargs)
    return sources


def _op_call(node: torch.fx.Node) -> tuple[tuple, dict]:
    """The node's arguments with fx nodes replaced by TensorMeta (tuples of them for multi-output values)."""

    def meta(value: Any) -> Any:
        if isinstance(value, torch.fx.Node):
            val = value.meta.get("val")
            if isinstance(val, torch.Tensor):
                return TensorMeta.of(val)
            if isinstance(val, (tuple, list)):
                return tuple(TensorMeta.of(v) if isinstance(v, torch.Tensor) else None for v in val)
            return val
        if isinstance(value, (list, tuple)):
            return type(value)(meta(v) for v in value)
        if isinstance(value, dict):
            return {k: meta(v) for k, v in value.items()}
        return value

    return meta(node.args), meta(node.kwargs)


__all__ = [
    "COST_UNIT_S",
    "PARAMETER_KINDS",
    "BuiltProblem",
    "ProblemOptions",
    "build_problem",
    "tensor_placements",
    "tied_middle_layers",
]
