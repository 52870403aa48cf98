"""Why a placement: one node's chosen strategy, its cost split, and the next-best alternatives.

The alternatives are *local*: each other strategy of the node is priced with every other node fixed, except
the node's group partner (a parameter and its gradient sink move together). Its delta is the change in the
whole objective (seconds): the node's own compute plus every incident edge's redistribution. A delta is
``"infeasible"`` when the change meets a forbidden strategy or edge, or breaks the memory budget.

A plan JSON does not store the solver's vector, so :func:`explain_plan_file` rebuilds the problem from the
plan's ``request`` and maps the plan's placements back onto strategy indices: parameters and inputs by their
spec, op nodes by name through their output *and* input specs (ties: the cheapest), gradient sinks from their
parameter. Nodes the plan does not name (buffers, the loss) take their best strategy given the rest. This
does not depend on the re-solve finding the same optimum (it need not: ties, time limits, another backend);
the result records whether the mapped assignment reproduces the plan's predicted step time.
"""

from __future__ import annotations

import copy
import difflib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from solver.problem import FORBIDDEN_COST
from strategies.placement import NONE, spec_text
from strategies.problem.builder import COST_UNIT_S, BuiltProblem, ProblemNode
from strategies.problem.recompute import RECOMPUTE

TOP_ALTERNATIVES = 5


class UnknownTarget(KeyError):
    """The target names no parameter or node; ``suggestions`` lists close names."""

    def __init__(self, target: str, suggestions: Sequence[str]) -> None:
        self.target = target
        self.suggestions = list(suggestions)
        hint = f"; close names: {', '.join(self.suggestions)}" if self.suggestions else ""
        super().__init__(f"no parameter or node named {target!r}{hint}")

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass
class _Local:
    members: list[int]
    edges: list[int]
    recompute_edges: list[int]
    """Problem edges after `BuiltProblem.edges` (`BuiltProblem.recompute_edges`) touching the members."""


def explain(built: BuiltProblem, solution: Sequence[int] | np.ndarray, target: str) -> dict[str, Any]:
    """The chosen strategy of ``target`` (a parameter name or a node name), its costs, and alternatives."""
    chosen = np.asarray(solution, dtype=np.int64)
    index = find_node(built, target)
    node = built.nodes[index]
    local = _local(built, index)
    problem = built.problem
    current = int(chosen[index])
    base = _local_cost(built, chosen, local, current)

    edges_out = []
    comm_in = comm_out = 0.0
    for e in local.edges:
        edge = built.edges[e]
        seconds = float(problem.edge_matrix(e)[chosen[edge.producer], chosen[edge.consumer]]) * COST_UNIT_S
        incoming = edge.consumer in local.members
        if incoming:
            comm_in += seconds
        else:
            comm_out += seconds
        edges_out.append(
            {
                "producer": built.nodes[edge.producer].name,
                "consumer": built.nodes[edge.consumer].name,
                "kind": edge.kind,
                "direction": "in" if incoming else "out",
                "seconds": seconds,
                "collectives": _collectives(built, chosen, edge),
            }
        )
    weight = built.node_weights()
    compute = float(sum(weight[m] * built.nodes[m].compute_s[current] for m in local.members))

    limit = problem.usage_limit
    options = []
    for s in range(len(node.output_specs)):
        cost = _local_cost(built, chosen, local, s)
        entry = {"strategy": s, **_placements(node, s)}
        if s == current:
            entry["delta_s"] = 0.0
        elif not math.isfinite(cost):
            entry["delta_s"] = "infeasible"
            entry["reason"] = "a forbidden strategy or redistribution"
        else:
            entry["delta_s"] = (cost - base) * COST_UNIT_S
            if limit is not None:
                peak = _peak(built, chosen, local, s)
                if peak > limit:
                    entry["delta_s"] = "infeasible"
                    entry["reason"] = f"peak memory {peak} B over the budget {limit} B"
        options.append(entry)
    others = [o for o in options if o["strategy"] != current]
    others.sort(key=_rank_key)
    ranking = [options[current] | {"chosen": True}]
    ranking += [o | {"chosen": False} for o in others[:TOP_ALTERNATIVES]]

    objective = _objective(built, chosen)
    return {
        "target": target,
        "node": node.name,
        "kind": node.kind,
        "index": index,
        "op": None if node.op is None else str(node.op),
        "group": [built.nodes[m].name for m in local.members],
        "pinned": any(m in problem.pins for m in local.members),
        "strategy_count": len(node.output_specs),
        "chosen": {
            "strategy": current,
            **_placements(node, current),
            "compute_s": compute,
            "comm_in_s": comm_in,
            "comm_out_s": comm_out,
            "total_s": compute + comm_in + comm_out,
            "memory_bytes": int(sum(int(built.nodes[m].memory_bytes[current]) for m in local.members)),
            "edges": edges_out,
        },
        "ranking": ranking,
        "alternatives": ranking[1:],
        "objective_s": objective,
    }


def _rank_key(option: dict[str, Any]) -> tuple[float, int]:
    delta = option["delta_s"]
    return (math.inf, option["strategy"]) if delta == "infeasible" else (delta, option["strategy"])


def explain_plan_file(plan_path: str | Path, target: str, progress: Any = None) -> dict[str, Any]:
    """:func:`explain_plan` of the plan JSON in ``plan_path``; the report's ``plan`` names the file."""
    plan = json.loads(Path(plan_path).read_text(encoding="utf-8"))
    report = explain_plan(plan, target, progress)
    report["plan"] = {"path": str(plan_path), **report["plan"]}
    return report


def explain_plan(plan: dict[str, Any], target: str, progress: Any = None) -> dict[str, Any]:
    """Explain ``target`` in a plan: rebuild its problem from ``plan["request"]`` (:func:`rebuild_plan`),
    map the plan's placements back onto strategy indices (see the module docstring) and :func:`explain`.
    ``progress`` hears one line before the rebuild (the re-plan's own phases are not the user's business).
    Raises :class:`UnknownTarget` before any work."""
    check_target_in_plan(plan, target)
    if progress is not None:
        model = plan.get("request", {}).get("model", "the plan")
        progress(f"rebuilding the problem of {model} from the plan's request")
    return explain_rebuilt(plan, rebuild_plan(plan), target)


def rebuild_plan(plan: dict[str, Any]) -> tuple[BuiltProblem, np.ndarray | None]:
    """The plan's problem and a fallback assignment (:func:`rebuild`), hardware figures sent as a mapping
    expanded first: what explaining any target of the plan needs, so a caller may keep it."""
    from strategies.cost.hardware import override_hardware

    rebuilt_from = plan
    if isinstance(plan.get("request", {}).get("hardware"), dict):
        rebuilt_from = copy.deepcopy(plan)
        rebuilt_from["request"]["hardware"] = override_hardware(plan["request"]["hardware"])
    return rebuild(rebuilt_from)


def explain_rebuilt(
    plan: dict[str, Any], rebuilt: tuple[BuiltProblem, np.ndarray | None], target: str
) -> dict[str, Any]:
    """:func:`explain_plan` on the problem :func:`rebuild_plan` gave for ``plan``."""
    from strategies.plan.plan_json import predict

    check_target_in_plan(plan, target)
    built, fallback = rebuilt
    chosen, unmapped = solution_from_plan(built, plan, fallback)
    report = explain(built, chosen, target)
    predicted = predict(built, chosen)["step_time_s"]
    recorded = plan.get("predicted", {}).get("step_time_s")
    report["plan"] = {
        "step_time_s": recorded,
        "mapped_step_time_s": predicted,
        "consistent": recorded is not None and math.isclose(predicted, recorded, rel_tol=1e-6, abs_tol=1e-12),
        "unmapped_nodes": unmapped,
    }
    return report


def check_target_in_plan(plan: dict[str, Any], target: str) -> None:
    """Raise :class:`UnknownTarget` early (before rebuilding) unless ``target`` names a parameter, its
    gradient (``NAME.grad``) or an op node of the plan."""
    names = list(plan.get("parameters", {})) + [n["name"] for n in plan.get("nodes", [])]
    extra = [f"{p}.grad" for p in plan.get("parameters", {})]
    if target in names or target in extra:
        return
    if not plan.get("nodes"):  # an old plan without node names: let the rebuilt problem decide
        return
    raise UnknownTarget(target, difflib.get_close_matches(target, names + extra, n=5, cutoff=0.5))


def find_node(built: BuiltProblem, target: str) -> int:
    """The problem node of a parameter name, else of a node name (op, gradient ``NAME.grad``, input, …).
    With a short capture standing for a deep stack, a parameter of any layer names its captured copy."""
    if built.repeat is not None and built.repeat.captured_name(target) in built.parameter_nodes:
        target = built.repeat.captured_name(target)
    if target in built.parameter_nodes:
        return built.parameter_nodes[target]
    for i, node in enumerate(built.nodes):
        if node.name == target:
            return i
    names = list(built.parameter_nodes) + [n.name for n in built.nodes if n.kind != "parameter"]
    raise UnknownTarget(target, difflib.get_close_matches(target, names, n=5, cutoff=0.5))


def rebuild(plan: dict[str, Any]) -> tuple[BuiltProblem, np.ndarray | None]:
    """The plan's problem, rebuilt by re-planning its request (a quick heuristic solve: only the problem and,
    for nodes the plan does not name, a fallback assignment are used)."""
    from dataclasses import replace

    from strategies.plan.planner import PlanRequest, plan_model

    request = PlanRequest(**plan["request"])
    quick = replace(request, backend="heuristic", time_limit=min(request.time_limit, 1.0))
    try:
        outcome = plan_model(quick)
    except Exception:  # the heuristic found nothing: the request as it was
        outcome = plan_model(request)
    solution = outcome.result.solution
    return outcome.built, None if solution is None else np.asarray(solution, dtype=np.int64)


def solution_from_plan(
    built: BuiltProblem, plan: dict[str, Any], fallback: np.ndarray | None = None
) -> tuple[np.ndarray, list[str]]:
    """Strategy indices reproducing the plan's placements; the names of nodes it could not map."""
    n = len(built.nodes)
    chosen = np.full(n, -1, dtype=np.int64)
    placements = plan.get("parameters", {})
    for name, index in built.parameter_nodes.items():
        spec = placements.get(built.repeat.full_name(name) if built.repeat is not None else name)
        if spec is not None:
            chosen[index] = _match(built.nodes[index], [spec], None)
            grad = built.gradient_nodes.get(name)
            if grad is not None and chosen[index] >= 0:
                chosen[grad] = chosen[index]
    for k, spec in enumerate(plan.get("inputs", [])):
        if k < len(built.input_nodes):
            index = built.input_nodes[k]
            chosen[index] = _match(built.nodes[index], [spec], None)
    by_name = {node.name: i for i, node in enumerate(built.nodes) if node.kind == "op"}
    recomputed = set(plan.get("recompute", []))
    for record in plan.get("nodes", []):
        index = by_name.get(record["name"])
        if index is not None:
            node = built.nodes[index]
            chosen[index] = _match(
                node, record.get("output", []), record.get("inputs"), record["name"] in recomputed
            )
    for group in built.problem.groups:  # group members share the index
        known = [int(chosen[m]) for m in group if chosen[m] >= 0]
        if known:
            chosen[list(group)] = known[0]
    for node, strategy in built.problem.pins.items():
        if chosen[node] < 0:
            chosen[node] = strategy
    unmapped = [int(i) for i in np.flatnonzero(chosen < 0)]
    names = [built.nodes[i].name for i in unmapped if len(built.nodes[i].output_specs) > 1]
    for i in unmapped:  # buffers, the loss sink, nodes the plan does not know: best response to the rest
        chosen[i] = fallback[i] if fallback is not None else 0
    for i in unmapped:
        local = _local(built, i)
        costs = [_local_cost(built, chosen, local, s) for s in range(len(built.nodes[i].output_specs))]
        chosen[local.members] = int(np.argmin(costs))
    return chosen, names


def _match(
    node: ProblemNode, outputs: Sequence[Any], inputs: Sequence[Any] | None, recomputed: bool = False
) -> int:
    """The strategy with these placements (and recomputed or not, for an op that may be: its strategies
    repeat once per mode); -1 when there is none."""
    keep = np.ones(len(node.output_specs), dtype=bool)
    if node.modes is not None:
        keep &= (node.modes == RECOMPUTE) == recomputed
    for k, spec in enumerate(outputs):
        if spec is None or k >= node.output_specs.shape[1]:
            continue
        keep &= (node.output_specs[:, k, :] == _codes(spec)).all(axis=1)
    for k, spec in enumerate(inputs or []):
        if k >= node.input_specs.shape[1]:
            continue
        want = np.full(node.input_specs.shape[2], NONE) if spec is None else _codes(spec)
        keep &= (node.input_specs[:, k, :] == want).all(axis=1)
    matches = np.flatnonzero(keep)
    if not len(matches):
        return -1
    return int(matches[np.argmin(node.compute_s[matches])])


def _codes(spec: Sequence[str]) -> np.ndarray:
    from strategies.placement import parse_spec

    return np.asarray(parse_spec(list(spec), unread=True), dtype=np.int64)


# --------------------------------------------------------------------------------------------- pricing
def _local(built: BuiltProblem, index: int) -> _Local:
    members = [index]
    for group in built.problem.groups:
        if index in group:
            members = [int(m) for m in group]
            break
    member_set = set(members)
    edges = [
        e for e, edge in enumerate(built.edges) if edge.producer in member_set or edge.consumer in member_set
    ]
    first = len(built.edges)
    extra = [first + k for k, pair in enumerate(built.recompute_edges) if set(pair) & member_set]
    return _Local(members, edges, extra)


def _local_cost(built: BuiltProblem, chosen: np.ndarray, local: _Local, s: int) -> float:
    """Objective terms touching ``local`` (problem units) when its members take strategy ``s``."""
    problem = built.problem
    total = 0.0
    for m in local.members:
        total += float(problem.node_costs(m)[s])
    member_set = set(local.members)
    for e in local.edges:
        edge = built.edges[e]
        u = s if edge.producer in member_set else int(chosen[edge.producer])
        v = s if edge.consumer in member_set else int(chosen[edge.consumer])
        total += float(problem.edge_matrix(e)[u, v])
    for e in local.recompute_edges:
        a, b = (int(x) for x in problem.edge_nodes[e])
        total += float(
            problem.edge_matrix(e)[s if a in member_set else chosen[a], s if b in member_set else chosen[b]]
        )
    return math.inf if not math.isfinite(total) or total >= FORBIDDEN_COST else total


def _peak(built: BuiltProblem, chosen: np.ndarray, local: _Local, s: int) -> int:
    from solver.evaluate import usage_profile

    trial = chosen.copy()
    trial[local.members] = s
    return int(usage_profile(built.problem, trial)[1].max(initial=0))


def _objective(built: BuiltProblem, chosen: np.ndarray) -> float:
    problem = built.problem
    total = float(problem.costs[problem.node_offsets[:-1] + chosen].sum())
    for e, (u, v) in enumerate(problem.edge_nodes.tolist()):
        total += float(problem.edge_matrix(e)[chosen[u], chosen[v]])
    return total * COST_UNIT_S


def _placements(node: ProblemNode, s: int) -> dict[str, Any]:
    outputs = [
        None if meta is None else spec_text(node.output_specs[s, k]) for k, meta in enumerate(node.outputs)
    ]
    inputs = [
        None if (node.input_specs[s, k] == NONE).all() else spec_text(node.input_specs[s, k])
        for k in range(node.input_specs.shape[1])
    ]
    placements = outputs[0] if node.kind != "op" and len(outputs) == 1 else outputs
    mode = None if node.modes is None else ("kept", "recomputed", "stored")[int(node.modes[s])]
    return {"placements": placements, "inputs": inputs, "memory_mode": mode}


def _collectives(built: BuiltProblem, chosen: np.ndarray, edge: Any) -> list[str]:
    from strategies.cost.comm import redistribute_steps

    producer, consumer = built.nodes[edge.producer], built.nodes[edge.consumer]
    meta = producer.outputs[edge.output]
    src = tuple(int(c) for c in producer.output_specs[chosen[edge.producer], edge.output])
    dst = tuple(int(c) for c in consumer.input_specs[chosen[edge.consumer], edge.argument])
    if meta is None:
        return []
    steps = redistribute_steps(built.mesh, meta.shape, meta.itemsize, src, dst)
    return [step.collective for step in steps if step.collective != "local"]


# --------------------------------------------------------------------------------------------- text
def explain_text(report: dict[str, Any]) -> str:
    """The report as a person reads it."""
    chosen = report["chosen"]
    group = report["group"]
    title = f"{report['kind']} {report['node']}"
    if report.get("op"):
        title += f" ({report['op']})"
    lines = [title]
    if len(group) > 1:
        lines.append(f"  moves with: {', '.join(g for g in group if g != report['node'])}")
    lines.append(
        f"  chosen strategy {chosen['strategy']} of {report['strategy_count']}: {_describe(report, chosen)}"
        + ("  (pinned)" if report["pinned"] else "")
    )
    lines.append(
        f"  cost {_ms(chosen['total_s'])}: compute {_ms(chosen['compute_s'])}, comm in "
        f"{_ms(chosen['comm_in_s'])}, comm out {_ms(chosen['comm_out_s'])}; "
        f"memory {chosen['memory_bytes'] / 2**20:.2f} MiB per device"
    )
    costly = [e for e in chosen["edges"] if e["seconds"] > 0]
    for e in sorted(costly, key=lambda e: -e["seconds"])[:8]:
        lines.append(
            f"    {e['direction']:<3} {e['producer']} -> {e['consumer']} ({e['kind']}): {_ms(e['seconds'])}"
            f" {'+'.join(e['collectives']) or ''}"
        )
    if not costly:
        lines.append("    no communication on its edges")
    lines.append("  next-best alternatives (only this node changes; delta of the step time):")
    if not report["alternatives"]:
        lines.append("    none: it has a single strategy")
    for alt in report["alternatives"]:
        delta = alt["delta_s"]
        if delta == "infeasible":
            text, reason = "infeasible", f"  ({alt.get('reason', '')})"
        else:
            text, reason = (f"+{_ms(delta)}" if delta >= 0 else f"-{_ms(-delta)}"), ""
        lines.append(f"    {text:<14} strategy {alt['strategy']}: {_describe(report, alt)}{reason}")
    plan = report.get("plan")
    if plan and not plan["consistent"]:
        lines.append(
            f"  note: the placements map to a step time of {_ms(plan['mapped_step_time_s'])}, "
            f"the plan records {_ms(plan['step_time_s'] or 0.0)}"
        )
    return "\n".join(lines)


def _describe(report: dict[str, Any], entry: dict[str, Any]) -> str:
    placements = entry["placements"]
    if report["kind"] != "op":
        return _spec(placements)
    outs = ", ".join("-" if p is None else _spec(p) for p in placements)
    ins = ", ".join("-" if p is None else _spec(p) for p in entry["inputs"])
    mode = {"kept": ", kept for the backward", "recomputed": ", recomputed in the backward"}
    return f"out {outs} <- in {ins}{mode.get(entry.get('memory_mode') or '', '')}"


def _spec(spec: Any) -> str:
    if spec is None:
        return "-"
    if spec and isinstance(spec[0], list):
        return ", ".join(_spec(s) for s in spec)
    return "[" + ", ".join(spec) + "]"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.4g} ms"


__all__ = ["UnknownTarget", "explain", "explain_plan_file", "explain_text", "find_node", "solution_from_plan"]
