"""Activation recomputation as a choice of the program: keep a value the backward reads, or make it again.

A forward op of transformer layer ``L`` whose output the backward reads (*saved*) may be **kept** (alive from
its forward to its last backward reader, as without recomputation) or **recomputed**: freed after its last
forward reader and made again when layer ``L``'s backward begins (``rematerialise``, the first backward op of
the layer), alive from then to its last backward reader -- what activation checkpointing of a layer does
(torchtitan's per-layer and per-op options, Megatron's selective and full recomputation; Checkmate states
rematerialisation as an integer program over every step, this is its per-layer special case, small enough to
stay pairwise and solved like every other choice).

Making a value again makes its *closure* again too: the forward ops of its layer between it and the values
that are there at ``rematerialise`` (its *frontier*: parameters, buffers, saved values kept or recomputed
themselves, and values *stored* for it), whose outputs the backward does not read (the attention scores a
recomputed softmax reads, the views and casts between two matmuls). Their bytes are not counted: they are made
and dropped during the recomputation, beside their readers (the largest such value is what the model leaves
out).

In the problem each candidate carries one copy of its strategy list per mode it may take (`KEEP` first, then
`RECOMPUTE`): the recomputed copies cost the op's compute twice and the redistribution of every activation
argument twice (a parameter's all-gather is not repeated: FSDP unshards a layer's parameters once for its
backward, and the recomputation runs inside it); an edge from each closure op adds that op's compute on its
chosen strategy (an op two recomputed values share is counted for each; the redistributions inside a closure
are not counted: they are the local views and casts between its ops). Its memory is split over nodes grouped
with it (same strategy index): the op's own node from its birth to its last forward reader; the *gap* to
``rematerialise`` holding its bytes only when kept; the *backward* part from ``rematerialise`` to its last
reader. A value the backward does not read that a recomputation may need and that is not in its closure (a
layer's input, made by the layer before) is `STORE`d: held from its forward to the last ``rematerialise``
that may need it. Not a choice of its own: storing it and recomputing its reader are two moves that pay off
only together, and the solver's heuristics, which move one node at a time, found no plan at all for
llama3-70b under 80 GiB that way (with it stored, one in 0.7 s). So the program counts it whether or not a
recomputation reads it, and the plan drops what none does (`BuiltProblem.unused_storage`).

Edges price ``inf`` every pair that leaves a frontier value absent when a recomputation needs it: a saved
value of the layer recomputed is there, of another layer only kept; a value to store only stored; anything
else only when it is still alive then. An op that writes into an argument (``bernoulli_`` into the
``empty_like`` of a dropout mask) is recomputed only with the op that made the argument, never into a kept
value. A value the backward reads before its layer's backward begins (the layer's output, read by the next
layer's backward) is never recomputed, nor one the step returns (the loss).

Policies: ``auto`` lets the program choose every candidate's mode; ``none`` has no candidates (the problem
without recomputation); ``selective`` recomputes every saved value but the outputs of matrix products and
attention (torchtitan's op-level selective policy: those stay, or are stored, where a recomputation needs
them), ``full`` every one (only each layer's input and what leaves the layer stay): both pin one mode per
candidate, keeping what cannot be recomputed. A callable ``policy(node) -> bool`` pins a hand-picked set the
same way (the activation-memory tests use Korthikanti et al.'s selective set).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
from torch import fx

from strategies.problem.layer_sharing import layer_of

KEEP, RECOMPUTE, STORE = 0, 1, 2
"""Modes of a candidate: kept as without recomputation (a value the backward does not read: dropped after
its forward); made again in the backward; held, though the backward does not read it, for recomputed readers
(a layer's input under full recomputation)."""
AUTO, NONE, SELECTIVE, FULL = "auto", "none", "selective", "full"
POLICIES = (AUTO, NONE, SELECTIVE, FULL)
"""The ``--recompute`` values."""

Policy = str | Callable[[fx.Node], bool]

RECOMPUTE_DISPATCH_S = 1e-6
"""Host time each op made again costs beyond its compute (one more dispatch in the backward, a lower bound of
a kernel launch's few microseconds): a view, which computes nothing, is then recomputed only where the memory
it frees is needed, not wherever it ties."""

_KEPT_BY_SELECTIVE = ("mm", "addmm", "bmm", "baddbmm", "_grouped_mm", "einsum", "linear", "matmul")
"""Ops whose outputs the ``selective`` policy keeps (besides every attention op)."""


@dataclass(frozen=True)
class Candidate:
    """A forward value whose life the program chooses, and the times that split its memory."""

    layer: int | None
    """Its layer (None: outside every layer, so only ever stored)."""
    saved: bool
    """The backward reads it."""
    modes: tuple[int, ...]
    """`KEEP`, `RECOMPUTE`, `STORE`: the modes it may take, in the order of its strategy copies."""
    forward_last: int
    """Position of its last forward reader (its own when none)."""
    rematerialise: int = 0
    """Position of its layer's first backward op, where it is made again (0 if it never is)."""
    closure: tuple[fx.Node, ...] = ()
    """The ops made again with it (outputs the backward does not read)."""
    frontier: tuple[fx.Node, ...] = ()
    """The values it and its closure read that must be there when they are made again."""
    store_until: int = 0
    """`STORE`: the last position its recomputed readers are made at."""


@dataclass(frozen=True)
class _Value:
    layer: int | None
    saved: bool
    forward_last: int
    recomputable: bool
    """In a layer, read by no earlier layer's backward, and not returned by the step."""


def check_policy(policy: Policy) -> None:
    """ValueError naming the allowed values for an unknown policy name."""
    if isinstance(policy, str) and policy not in POLICIES:
        raise ValueError(f"recompute: {policy!r} is not one of {', '.join(POLICIES)}")


def find_candidates(
    order: list[fx.Node],
    position: Mapping[fx.Node, int],
    backward_start: int,
    paths: Mapping[str, str],
    last_use: Mapping[fx.Node, int],
    always_there: set[fx.Node],
    written: set[tuple[fx.Node, fx.Node]],
    policy: Policy,
) -> dict[fx.Node, Candidate]:
    """The candidates of a step (see the module docstring). ``order``: the op nodes in execution order;
    ``position`` their 1-based positions; ``backward_start`` the index in ``order`` of the first backward op;
    ``paths`` module paths (layers inherited); ``last_use`` each node's last reader's position;
    ``always_there``: placeholders alive the whole step (parameters, buffers); ``written``: ``(op, value)``
    pairs where the op writes into the value (or into a view of it on the way)."""
    check_policy(policy)
    if policy == NONE:
        return {}
    rematerialise: dict[int, int] = {}
    for node in order[backward_start:]:
        layer = layer_of(paths.get(node.name, ""))
        if layer is not None:
            rematerialise.setdefault(layer, position[node])
    values = _forward_values(order[:backward_start], position, backward_start + 1, paths, rematerialise)
    fixed = policy != AUTO
    # value -> (its layer's rematerialise, its closure, its frontier)
    recomputed: dict[fx.Node, tuple[int, tuple[fx.Node, ...], tuple[fx.Node, ...]]] = {}
    stored: dict[fx.Node, int] = {}  # unsaved value -> the last moment a recomputation needs it
    for node, value in values.items():
        if not (value.saved and value.recomputable and _wants(policy, node)):
            continue
        moment = rematerialise[value.layer]  # type: ignore[index]
        found = _closure(node, values, policy, written)
        if found is None:
            continue
        closure, frontier = found
        if all(
            _there(source, value.layer, moment, values, recomputed, fixed, always_there, last_use)
            for source in frontier
        ):
            recomputed[node] = (moment, closure, frontier)
            for source in frontier:
                if source in values and not values[source].saved:
                    stored[source] = max(stored.get(source, 0), moment)
    candidates: dict[fx.Node, Candidate] = {}
    for node, value in values.items():
        if node in recomputed:
            modes = (RECOMPUTE,) if fixed else (KEEP, RECOMPUTE)
            moment, closure, frontier = recomputed[node]
            candidates[node] = Candidate(
                value.layer, True, modes, value.forward_last, moment, closure, frontier
            )
        elif node in stored:
            candidates[node] = Candidate(
                value.layer, False, (STORE,), value.forward_last, store_until=stored[node]
            )
    return candidates


def _there(
    source: fx.Node,
    layer: int | None,
    moment: int,
    values: Mapping[fx.Node, _Value],
    recomputed: Mapping[fx.Node, object],
    fixed: bool,
    always_there: set[fx.Node],
    last_use: Mapping[fx.Node, int],
) -> bool:
    """Whether a frontier value can be there at ``moment``, when an op of ``layer`` is made again."""
    if source not in values:
        return source in always_there or last_use[source] >= moment
    if not values[source].saved:
        return True  # stored
    if source in recomputed:  # made again in its own layer's backward, or (auto) kept
        return values[source].layer == layer or not fixed
    return last_use[source] >= moment


def _closure(
    node: fx.Node, values: Mapping[fx.Node, _Value], policy: Policy, written: set[tuple[fx.Node, fx.Node]]
) -> tuple[tuple[fx.Node, ...], tuple[fx.Node, ...]] | None:
    """(closure, frontier) of a saved value (module docstring), or None when an op of it writes into a value
    that would not be made again."""
    layer = values[node].layer
    closure: list[fx.Node] = []
    frontier: list[fx.Node] = []
    pending, seen = [node], {node}
    while pending:
        reader = pending.pop()
        for source in _arguments(reader):
            value = values.get(source)
            inside = (
                value is not None
                and not value.saved
                and value.layer == layer
                and value.recomputable
                and _wants(policy, source)
            )
            if (reader, source) in written and not inside:
                return None
            if source in seen:
                continue
            seen.add(source)
            if inside:
                closure.append(source)
                pending.append(source)
            else:
                frontier.append(source)
    return tuple(closure), tuple(frontier)


def _forward_values(
    forward: list[fx.Node],
    position: Mapping[fx.Node, int],
    first_backward: int,
    paths: Mapping[str, str],
    rematerialise: Mapping[int, int],
) -> dict[fx.Node, _Value]:
    values: dict[fx.Node, _Value] = {}
    for node in forward:
        if node.target is operator.getitem:
            continue
        layer = layer_of(paths.get(node.name, ""))
        layer = layer if layer in rematerialise else None
        readers = _reader_positions(node, position)
        backward_reads = [p for p in readers if p >= first_backward]
        forward_last = max((p for p in readers if p < first_backward), default=position[node])
        recomputable = (
            layer is not None
            and min(backward_reads, default=math.inf) >= rematerialise[layer]
            and all(user.op != "output" for user in node.users)  # the loss: the step returns it
        )
        values[node] = _Value(layer, bool(backward_reads), forward_last, recomputable)
    return values


def available_rows(
    candidate: Candidate | None,
    modes: np.ndarray,
    consumer: Candidate,
    always_there: bool,
    last_use: int,
) -> np.ndarray:
    """Per strategy of a frontier value's producer (its mode in ``modes``), whether the value is there when
    ``consumer`` is made again."""
    if candidate is None:
        return np.full(len(modes), always_there or last_use >= consumer.rematerialise)
    recomputed_here = (modes == RECOMPUTE) & (candidate.layer == consumer.layer)
    return recomputed_here | (modes == STORE) | ((modes == KEEP) & candidate.saved)


def _wants(policy: Policy, node: fx.Node) -> bool:
    """Whether the policy would recompute ``node`` (``auto``: every op may be)."""
    if callable(policy):
        return bool(policy(node))
    if policy == SELECTIVE:
        name = _op_name(node)
        return name not in _KEPT_BY_SELECTIVE and "attention" not in name
    return True


def _op_name(node: fx.Node) -> str:
    schema = getattr(node.target, "_schema", None)
    return schema.name.split("::")[-1] if schema is not None else str(node.target)


def _reader_positions(node: fx.Node, position: Mapping[fx.Node, int]) -> list[int]:
    """Positions of the ops that read ``node``'s outputs (through ``getitem``)."""
    found: list[int] = []
    for user in node.users:
        if user.op == "call_function" and user.target is operator.getitem:
            found += [position[u] for u in user.users if u in position]
        elif user in position:
            found.append(position[user])
    return found


def _arguments(node: fx.Node) -> list[fx.Node]:
    """The nodes whose values ``node`` reads, in argument order (a ``getitem`` stands for its producer)."""
    found: dict[fx.Node, None] = {}
    for source in node.all_input_nodes:
        if source.op == "call_function" and source.target is operator.getitem:
            source = source.args[0]
        found[source] = None
    return list(found)


__all__ = [
    "AUTO",
    "FULL",
    "KEEP",
    "NONE",
    "POLICIES",
    "RECOMPUTE",
    "RECOMPUTE_DISPATCH_S",
    "SELECTIVE",
    "STORE",
    "Candidate",
    "Policy",
    "available_rows",
    "check_policy",
    "find_candidates",
]
