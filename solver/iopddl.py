"""Read and write the IOPDDL problem format (ASPLOS 2025 contest), `.json` or `.json.gz`.

Layout: ``{"problem": {"name", "nodes": {"intervals", "costs", "usages"}, "edges": {"nodes", "costs"},
"usage_limit"}}``. Costs of 1e18 or more are forbidden and read as ``inf``; integer costs up to 2**53 are
held exactly in float64 and written back as the same integers (``inf`` is written as 1e18). autoshard adds
two optional keys under ``problem``: ``groups`` (lists of nodes sharing one strategy index) and ``pins``
(``{"node": strategy}``).

Files are read leniently (keys this reader does not know are ignored); documents from an untrusted
caller are read with ``from_dict(document, strict=True)``, which refuses unknown keys by name.
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
_MAX_INT64 = 2**63 - 1
_MAX_NAME_CHARS = 256
"""Longest problem name a strict read accepts."""
_KNOWN_KEYS = {
    "": ("problem",),
    "problem": ("name", "nodes", "edges", "usage_limit", "groups", "pins"),
    "problem.nodes": ("intervals", "costs", "usages"),
    "problem.edges": ("nodes", "costs"),
}
"""Where a document's objects are (``""`` the top) -> the keys they may hold in a strict read."""


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


def from_dict(document: Any, *, strict: bool = False) -> Problem:
    """Build a `Problem` from the parsed IOPDDL document; anything malformed raises `ProblemError` naming
    the field.

    ``strict`` (for documents from untrusted callers) also refuses a key this reader does not know, at
    the top, under ``problem``, ``problem.nodes`` or ``problem.edges`` (``"problem.<key>: unknown
    field"``), and a ``name`` that is not a string of at most 256 characters.
    """
    if strict:
        _refuse_unknown_keys(document, "")
    body = _get(document, "problem", dict, "")
    if strict:
        _refuse_unknown_keys(body, "problem")
    nodes = _get(body, "nodes", dict, "problem.")
    edges = body.get("edges", {"nodes": [], "costs": []})
    if not isinstance(edges, dict):
        raise ProblemError("problem.edges", "must be an object")
    if strict:
        _refuse_unknown_keys(nodes, "problem.nodes")
        _refuse_unknown_keys(edges, "problem.edges")
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
    if limit is not None and not (_is_int(limit) and limit <= _MAX_INT64):
        raise ProblemError("problem.usage_limit", f"must be an integer at most {_MAX_INT64} (2**63 - 1)")
    groups = body.get("groups", [])
    if not isinstance(groups, list) or not all(
        isinstance(g, list) and all(_is_int(x) for x in g) for g in groups
    ):
        raise ProblemError("problem.groups", "must be a list of lists of node indices")
    pins = _pins(body.get("pins", {}))
    name = body.get("name", "")
    if strict and not (isinstance(name, str) and len(name) <= _MAX_NAME_CHARS):
        raise ProblemError("problem.name", f"must be a string of at most {_MAX_NAME_CHARS} characters")
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


def _refuse_unknown_keys(container: Any, where: str) -> None:
    """Raise `ProblemError` (``"<where>.<key>: unknown field"``) for a key of ``container`` (an object of
    the document; anything else is left to the type checks) that :data:`_KNOWN_KEYS` does not list."""
    if not isinstance(container, dict):
        return
    for key in container:
        if key not in _KNOWN_KEYS[where]:
            raise ProblemError(f"{where}.{key}" if where else str(key), "unknown field")


def _pins(raw: Any) -> dict[int, int]:
    """``{"node": strategy}`` as ints: a key is a node index written in decimal digits (or an int), a value
    an int (not a bool or a float, so neither 1.5 nor 1e400 is read as some integer), both within int64."""
    if not isinstance(raw, dict):
        raise ProblemError("problem.pins", "must be an object {node: strategy}")
    pins: dict[int, int] = {}
    for key, value in raw.items():
        digits = isinstance(key, str) and key.isascii() and key.isdecimal() and len(key) <= 18
        node = int(key) if digits else key
        if not (_is_int(node) and abs(node) <= _MAX_INT64):
            raise ProblemError("problem.pins", "keys must be node indices, at most 18 decimal digits")
        if not (_is_int(value) and abs(value) <= _MAX_INT64):
            raise ProblemError("problem.pins", "values must be strategy indices, integers within int64")
        pins[node] = value
    return pins


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
