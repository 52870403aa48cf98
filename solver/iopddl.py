"""Read and write the IOPDDL problem format (ASPLOS 2025 contest), `.json` or `.json.gz`.

Layout: ``{"problem": {"name", "nodes": {"intervals", "costs", "usages"}, "edges": {"nodes", "costs"},
"usage_limit"}}``. Costs of 1e18 or more are forbidden and read as ``inf``; integer costs up to 2**53 are
held exactly in float64 and written back as the same integers (``inf`` is written as 1e18). autoshard adds
two optional keys under ``problem``: ``groups`` (lists of nodes sharing one strategy index) and ``pins``
(``{"node": strategy}``).
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from solver.errors import ProblemError
from solver.problem import Problem

#: How a forbidden cost is written back.
FORBIDDEN_INT = 10**18
_EXACT_FLOAT_LIMIT = 2**53


def load(path: str | Path) -> Problem:
    """Read a problem file; raise `ProblemError` naming the field on bad input."""
    path = Path(path)
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", encoding="utf-8") as handle:  # type: ignore[operator]
            document = json.load(handle)
    except FileNotFoundError as exc:
        raise ProblemError("PROBLEM", f"no such file: {path}") from exc
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProblemError("PROBLEM", f"{path} is not valid JSON: {exc}") from exc
    problem = from_dict(document)
    if not problem.name:
        problem = problem.replace(name=path.name.split(".")[0])
    return problem


def from_dict(document: Any) -> Problem:
    """Build a `Problem` from the parsed IOPDDL document."""
    body = _get(document, "problem", dict, "")
    nodes = _get(body, "nodes", dict, "problem.")
    edges = body.get("edges", {"nodes": [], "costs": []})
    if not isinstance(edges, dict):
        raise ProblemError("problem.edges", "must be an object")
    costs = _get(nodes, "costs", list, "problem.nodes.")
    usages = nodes.get("usages")
    intervals = nodes.get("intervals")
    for field_name, values in (("usages", usages), ("intervals", intervals)):
        if values is not None and (not isinstance(values, list) or len(values) != len(costs)):
            raise ProblemError(
                f"problem.nodes.{field_name}", f"must be a list with one entry per node ({len(costs)})"
            )
    _check_numbers(costs, "problem.nodes.costs")
    if usages is not None:
        _check_numbers(usages, "problem.nodes.usages")
    edge_nodes = edges.get("nodes", [])
    edge_costs = edges.get("costs", [])
    if not isinstance(edge_nodes, list) or not isinstance(edge_costs, list):
        raise ProblemError("problem.edges", "nodes and costs must be lists")
    _check_numbers(edge_costs, "problem.edges.costs")
    for e, pair in enumerate(edge_nodes):
        if not (isinstance(pair, list) and len(pair) == 2 and all(_is_int(x) for x in pair)):
            raise ProblemError(f"problem.edges.nodes[{e}]", "must be a pair of node indices")
    if intervals is not None:
        for i, pair in enumerate(intervals):
            if not (isinstance(pair, list) and len(pair) == 2 and all(_is_int(x) for x in pair)):
                raise ProblemError(f"problem.nodes.intervals[{i}]", "must be a pair [start, end)")
    limit = body.get("usage_limit")
    if limit is not None and not _is_int(limit):
        raise ProblemError("problem.usage_limit", "must be an integer")
    groups = body.get("groups", [])
    if not isinstance(groups, list) or not all(
        isinstance(g, list) and all(_is_int(x) for x in g) for g in groups
    ):
        raise ProblemError("problem.groups", "must be a list of lists of node indices")
    pins_raw = body.get("pins", {})
    if not isinstance(pins_raw, dict):
        raise ProblemError("problem.pins", "must be an object {node: strategy}")
    try:
        pins = {int(k): int(v) for k, v in pins_raw.items()}
    except (TypeError, ValueError) as exc:
        raise ProblemError("problem.pins", "keys and values must be integers") from exc
    name = body.get("name", "")
    try:
        return Problem.from_lists(
            costs=costs,
            usages=usages,
            intervals=intervals,
            edges=edge_nodes,
            edge_costs=edge_costs,
            usage_limit=None if limit is None else int(limit),
            groups=groups,
            pins=pins,
            name=str(name),
        )
    except ProblemError as error:
        field_name = error.field if error.field.startswith("problem") else f"problem.{error.field}"
        raise ProblemError(field_name, error.message) from error


def to_dict(problem: Problem) -> dict[str, Any]:
    """The IOPDDL document of a problem; integral problems are written with integer costs."""
    as_int = problem.is_integral

    def encode(values: np.ndarray) -> list[Any]:
        if as_int:
            return [FORBIDDEN_INT if math.isinf(x) else int(x) for x in values.tolist()]
        return [FORBIDDEN_INT if math.isinf(x) else x for x in values.tolist()]

    n = problem.num_nodes
    nodes = {
        "intervals": problem.intervals.tolist(),
        "costs": [encode(problem.node_costs(i)) for i in range(n)],
        "usages": [problem.node_usages(i).tolist() for i in range(n)],
    }
    edges = {
        "nodes": problem.edge_nodes.tolist(),
        "costs": [
            encode(problem.edge_costs[problem.edge_offsets[e] : problem.edge_offsets[e + 1]])
            for e in range(problem.num_edges)
        ],
    }
    body: dict[str, Any] = {"name": problem.name, "nodes": nodes, "edges": edges}
    if problem.usage_limit is not None:
        body["usage_limit"] = int(problem.usage_limit)
    if problem.groups:
        body["groups"] = [list(g) for g in problem.groups]
    if problem.pins:
        body["pins"] = {str(k): int(v) for k, v in sorted(problem.pins.items())}
    return {"problem": body}


def save(problem: Problem, path: str | Path) -> None:
    """Write a problem as IOPDDL JSON (gzip when the name ends in `.gz`)."""
    path = Path(path)
    text = json.dumps(to_dict(problem))
    if path.suffix == ".gz":
        with gzip.open(path, "wt", encoding="utf-8") as handle:
            handle.write(text)
    else:
        path.write_text(text, encoding="utf-8")


def _get(container: Any, key: str, kind: type, prefix: str) -> Any:
    if not isinstance(container, dict) or key not in container:
        raise ProblemError(f"{prefix}{key}", "is missing")
    value = container[key]
    if not isinstance(value, kind):
        raise ProblemError(f"{prefix}{key}", f"must be a {'list' if kind is list else 'JSON object'}")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_numbers(rows: list[Any], field_name: str) -> None:
    """Every row must be a non-empty list of finite numbers; integers must fit float64 exactly."""
    for i, row in enumerate(rows):
        if not isinstance(row, list):
            raise ProblemError(f"{field_name}[{i}]", "must be a list of numbers")
        for x in row:
            if isinstance(x, bool) or not isinstance(x, int | float):
                raise ProblemError(f"{field_name}[{i}]", f"holds {x!r}, not a number")
            if isinstance(x, float) and not math.isfinite(x):
                raise ProblemError(f"{field_name}[{i}]", f"holds {x!r}")
            if isinstance(x, int) and _EXACT_FLOAT_LIMIT < x < FORBIDDEN_INT:
                raise ProblemError(
                    f"{field_name}[{i}]", f"value {x} is too large to hold exactly (max 2**53)"
                )
