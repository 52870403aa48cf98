"""Hand-written baselines under the planner's own cost model: DDP, FSDP, Megatron TP and FSDP x TP.

A baseline fixes the placement of every parameter (and of the batch inputs) as its authors would, then lets
the solver choose everything else (activations, redistributions) on the same problem the ILP plan solves.
So a baseline is the ILP with more pins: its step time is never below the plan's when both are optimal.

Rules (``ndim`` mesh axes; "the last axis" is the tensor-parallel one):

- ``ddp``: every parameter ``R`` on every axis; the batch (dim 0 of the inputs) sharded over all axes;
- ``fsdp``: every parameter ``S(0)`` over all axes where dim 0 can be cut that many ways (else ``R`` on the
  axes that do not fit); batch over all axes;
- ``megatron``: tensor parallel on the last axis, data parallel on the others (1-D: pure TP, inputs ``R``).
  Column-parallel linears (``wq wk wv w1 w3 c_fc c_attn up gate q_proj k_proj v_proj fc1``) ``S(0)`` weight
  and bias; row-parallel (``wo w2 c_proj down o_proj fc2``) ``S(1)`` weight, ``R`` bias; token embeddings
  vocab-parallel ``S(0)`` when the embedding op has such a strategy, else ``S(1)`` (hidden-sharded); the
  output head (``output``, ``lm_head``) ``S(0)``; everything else (norms, position embeddings, routers) ``R``;
- ``hsdp`` (meshes of 2+ axes): hybrid sharded data parallel, FSDP's ``S(0)`` on the last axis (inside a
  node) and ``R`` on the others (replicas across nodes); batch over all axes;
- ``fsdp_tp`` (meshes of 2+ axes): Megatron on the last axis combined with FSDP's ``S(0)`` on the others.

In ``megatron`` and ``fsdp_tp`` a parameter's shard on the last axis is also kept all the way to the ops that
read it (its cast, its transpose, the matmul): Megatron never gathers a tensor-parallel weight, it moves
activations. Without that the solver may gather the weight over the last axis and split the batch there
instead, which is FSDP over that axis, not tensor parallelism (:func:`baseline_problem`).

The batch pin goes on every input whose dim 0 equals the first input's (tokens and targets alike). A pin that
is not among a node's strategies falls back to ``R`` on the axes that do not fit; the result's ``message``
says which.

:func:`restrict_to_baseline` asks a narrower question than a baseline: the named parameters keep the
baseline's placement on some mesh axes only (``megatron`` on the ``tp`` axis, say) and everything else stays
free. Its optimum equals the plan's exactly when that part of the baseline is optimal.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from solver.problem import Problem
from strategies.placement import R, spec_text
from strategies.problem.builder import BuiltProblem, ProblemNode
from strategies.problem.comm_roles import PARAMETER

BASELINES = ("ddp", "fsdp", "hsdp", "megatron", "fsdp_tp")
TENSOR_PARALLEL = ("megatron", "fsdp_tp")
"""The baselines whose last axis is tensor parallel."""

_COLUMN = re.compile(
    r"^(wq|wk|wv|w1|w3|c_fc|c_attn|up|up_proj|gate|gate_proj|w_gate|w_up|q_proj|k_proj|v_proj|qkv|fc1)$"
)
_ROW = re.compile(r"^(wo|w2|c_proj|down|down_proj|w_down|o_proj|out_proj|fc2)$")
_EMBEDDING = re.compile(r"^(tok_embeddings|wte|embed|embed_tokens|word_embeddings)$")
_HEAD = re.compile(r"^(output|lm_head)$")


@dataclass
class BaselineResult:
    name: str
    status: str
    """The solver's status (``optimal``, ``feasible``, …), ``infeasible``, or ``not_applicable``."""
    step_time_s: float | None
    peak_memory_bytes: int | None
    feasible: bool
    message: str = ""
    predicted: dict[str, Any] = field(default_factory=dict)
    """``strategies.plan.plan_json.predict`` of the baseline's assignment (compute, comm, bytes,
    collectives)."""
    solution: list[int] | None = None
    pins: dict[int, int] = field(default_factory=dict)


def baseline_pins(
    name: str, built: BuiltProblem, parameter_names: Iterable[str] | None = None
) -> dict[int, int]:
    """Node index -> strategy index for the baseline ``name``'s parameters (``parameter_names``, default
    all) and batch inputs."""
    return _baseline_pins(name, built, parameter_names)[0]


def baseline_problem(name: str, built: BuiltProblem) -> Problem:
    """``built``'s problem as the baseline ``name`` runs it: its pins, and for the tensor-parallel baselines
    the ops a parameter reaches its readers through (its cast, transpose, view: edges of role ``parameter``)
    restricted to the strategies that take the parameter as its shard on the last axis already is, so none
    gathers or re-cuts it there (a slice of a replicated parameter stays allowed)."""
    pins = baseline_pins(name, built)
    problem = built.problem.replace(pins={**built.problem.pins, **pins})
    if name not in TENSOR_PARALLEL:
        return problem
    axis = built.mesh.ndim - 1
    nodes, edges, roles = built.nodes, built.edges, built.roles()
    allowed = {index: np.eye(len(nodes[index].output_specs), dtype=bool)[pins[index]] for index in pins}
    into: dict[int, list[int]] = {}
    for e, edge in enumerate(edges):
        if roles[e] == PARAMETER:
            into.setdefault(edge.consumer, []).append(e)
    costs = problem.costs.copy()
    for consumer in built.step_roles().ops:
        mask = np.ones(len(nodes[consumer].input_specs), dtype=bool)
        for e in into.get(consumer, ()):
            edge = edges[e]
            if edge.producer not in allowed:
                continue
            codes = np.unique(nodes[edge.producer].output_specs[allowed[edge.producer], edge.output, axis])
            if R not in codes:
                mask &= np.isin(nodes[consumer].input_specs[:, edge.argument, axis], codes)
        if not mask.any():  # no strategy takes the shard as it is: the op stays free
            continue
        allowed[consumer] = mask
        costs[problem.node_offsets[consumer] : problem.node_offsets[consumer + 1]][~mask] = np.inf
    return problem.replace(costs=costs)


def solve_baseline(
    name: str, built: BuiltProblem, time_limit: float = 60.0, backend: str = "auto"
) -> BaselineResult:
    """Pin the baseline's placements on ``built`` and solve the rest; never raises for infeasibility."""
    from solver.errors import InfeasibleError
    from solver.evaluate import usage_profile
    from solver.solve import SolveOptions, solve
    from strategies.plan.plan_json import predict

    if name not in BASELINES:
        raise ValueError(f"unknown baseline {name!r}; choose one of {', '.join(BASELINES)}")
    if name in ("fsdp_tp", "hsdp") and built.mesh.ndim < 2:
        return BaselineResult(name, "not_applicable", None, None, False, f"{name} needs a mesh of 2+ axes")
    pins, notes = _baseline_pins(name, built, None)
    problem = baseline_problem(name, built)
    message = "; ".join(notes)
    try:
        result = solve(problem, SolveOptions(backend=backend, time_limit=time_limit))
    except InfeasibleError as error:
        text = f"{message}; {error}" if message else str(error)
        return BaselineResult(name, "infeasible", None, None, False, text, pins=pins)
    if result.solution is None:
        text = "; ".join(filter(None, [message, result.message or f"no solution ({result.status})"]))
        return BaselineResult(name, result.status, None, None, False, text, pins=pins)
    chosen = np.asarray(result.solution, dtype=np.int64)
    predicted = predict(built, chosen)
    peak = int(usage_profile(problem, chosen)[1].max(initial=0))
    return BaselineResult(
        name,
        result.status,
        float(predicted["step_time_s"]),
        peak,
        True,
        message,
        predicted=predicted,
        solution=[int(s) for s in result.solution],
        pins=pins,
    )


def restrict_to_baseline(
    name: str,
    built: BuiltProblem,
    parameter_names: Iterable[str] | None = None,
    axes: Iterable[int] | None = None,
) -> Problem:
    """``built``'s problem where each named parameter (default all) may only take strategies that agree with
    the baseline ``name`` on ``axes`` (default all axes); the other strategies are forbidden (infinite cost).

    The parameter's gradient sink is grouped with it, so the gradient follows. Inputs are not restricted.
    """
    ndim = built.mesh.ndim
    chosen_axes = sorted(set(range(ndim) if axes is None else axes))
    if not chosen_axes or any(not 0 <= a < ndim for a in chosen_axes):
        raise ValueError(f"axes: expected mesh axes in 0..{ndim - 1}, got {chosen_axes}")
    pins, _ = _baseline_pins(name, built, parameter_names)
    problem = built.problem
    costs = problem.costs.copy()
    for index in set(pins) & set(built.parameter_nodes.values()):
        specs = built.nodes[index].output_specs[:, 0, :][:, chosen_axes]
        differs = (specs != specs[pins[index]]).any(axis=1)
        costs[problem.node_offsets[index] : problem.node_offsets[index + 1]][differs] = np.inf
    return problem.replace(costs=costs)


def solve_baselines(
    built: BuiltProblem, time_limit: float = 60.0, backend: str = "auto", names: Iterable[str] = BASELINES
) -> list[BaselineResult]:
    return [solve_baseline(n, built, time_limit, backend) for n in names]


# --------------------------------------------------------------------------------------------- rules
def _baseline_pins(
    name: str, built: BuiltProblem, parameter_names: Iterable[str] | None
) -> tuple[dict[int, int], list[str]]:
    if name not in BASELINES:
        raise ValueError(f"unknown baseline {name!r}; choose one of {', '.join(BASELINES)}")
    ndim = built.mesh.ndim
    if name in ("fsdp_tp", "hsdp") and ndim < 2:
        raise ValueError(f"{name} needs a mesh of 2+ axes")
    names = list(built.parameter_nodes) if parameter_names is None else list(parameter_names)
    pins: dict[int, int] = {}
    notes: list[str] = []
    for pname in names:
        if pname not in built.parameter_nodes:
            raise ValueError(f"parameters.{pname}: no such parameter")
        index = built.parameter_nodes[pname]
        node = built.nodes[index]
        want = _parameter_spec(name, pname, index, built)
        pins[index] = _pin(node, want, f"parameter {pname}", notes)
    # Inputs: the batch over the data-parallel axes.
    # megatron / fsdp_tp: data parallel on all but the last axis
    batch_axes = list(range(ndim)) if name in ("ddp", "fsdp", "hsdp") else list(range(ndim - 1))
    batch_inputs = _batch_inputs(built)
    for index in built.input_nodes:
        if index in batch_inputs:  # other inputs stay free
            want = tuple(0 if a in batch_axes else R for a in range(ndim))
            pins[index] = _pin(built.nodes[index], want, f"input {built.nodes[index].name}", notes)
    return pins, notes


def _parameter_spec(name: str, pname: str, index: int, built: BuiltProblem) -> tuple[int, ...]:
    ndim = built.mesh.ndim
    if name == "ddp":
        return (R,) * ndim
    if name == "fsdp":
        return (0,) * ndim
    if name == "hsdp":
        return (R,) * (ndim - 1) + (0,)
    tp = _megatron_code(pname, index, built)
    if name == "megatron":
        return (R,) * (ndim - 1) + (tp,)
    return (0,) * (ndim - 1) + (tp,)  # fsdp_tp


def _megatron_code(pname: str, index: int, built: BuiltProblem) -> int:
    """The tensor-parallel placement of one parameter on the last axis."""
    parts = pname.split(".")
    kind = parts[-1]
    owner = parts[-2] if len(parts) >= 2 else parts[0]
    ndim_tensor = built.nodes[index].outputs[0].ndim
    if _COLUMN.match(owner):
        return 0
    if _ROW.match(owner):
        return 1 if kind != "bias" and ndim_tensor >= 2 else R
    if _HEAD.match(owner):
        return 0
    if _EMBEDDING.match(owner) and ndim_tensor == 2:
        return 0 if _consumer_accepts(built, index, axis=built.mesh.ndim - 1, code=0) else 1
    return R


def _consumer_accepts(built: BuiltProblem, index: int, axis: int, code: int) -> bool:
    """Whether some op reading parameter ``index`` has a strategy taking it with ``code`` on ``axis``
    (Megatron's vocab-parallel embedding needs a masked-lookup strategy)."""
    for edge in built.edges:
        if edge.producer != index or edge.kind != "parameter":
            continue
        consumer = built.nodes[edge.consumer]
        # Only a direct embedding lookup counts (a matmul through a transpose is the tied output head).
        if (
            consumer.kind == "op"
            and "embedding" in str(consumer.op)
            and (consumer.input_specs[:, edge.argument, axis] == code).any()
        ):
            return True
    return False


def _batch_inputs(built: BuiltProblem) -> set[int]:
    """Inputs carrying the batch: those whose dim 0 equals the first input's."""
    if not built.input_nodes:
        return set()
    first = built.nodes[built.input_nodes[0]].outputs[0]
    if first is None or first.ndim == 0:
        return set()
    batch = first.shape[0]
    return {
        i
        for i in built.input_nodes
        if (meta := built.nodes[i].outputs[0]) is not None and meta.ndim > 0 and meta.shape[0] == batch
    }


def _pin(node: ProblemNode, want: tuple[int, ...], what: str, notes: list[str]) -> int:
    """The strategy index of ``want``, or of ``want`` with the fewest axes set back to ``R``."""
    specs = node.output_specs[:, 0, :]
    sharded = [a for a, c in enumerate(want) if c != R]
    for k in range(len(sharded) + 1):
        for axes in itertools.combinations(reversed(sharded), k):
            spec = tuple(R if a in axes else c for a, c in enumerate(want))
            match = np.flatnonzero((specs == np.asarray(spec)).all(axis=1))
            if len(match):
                if k:
                    notes.append(
                        f"{what}: {spec_text(want)} is not possible for shape "
                        f"{list(node.outputs[0].shape)}; using {spec_text(spec)}"
                    )
                return int(match[0])
    raise AssertionError(f"{what}: not even all-R is a strategy")  # placeholders always have all-R


__all__ = [
    "BASELINES",
    "BaselineResult",
    "baseline_pins",
    "baseline_problem",
    "restrict_to_baseline",
    "solve_baseline",
    "solve_baselines",
]
