"""A submission as the service takes it in: its body read (parsed, bounded, canonicalised, hashed) and then
checked in full, before any job exists.

Reading (:func:`read_plan`, :func:`read_solve`, :func:`read_search`) turns the raw body into an
:class:`Intake`: the content hash that keys the result and the job (equal requests, defaults included, share
one), the canonical JSON text stored with the job (nothing the client sent beyond the known fields), and the
work it asks for. Checking (:func:`check`) does what needs the model or the graph: a built-in model built on
the meta device with its options, a graph document read as the planner will read it, pinned placements
against the model's parameters and inputs, the service's caps. Both raise :class:`BadRequest` naming the
field; both are plain functions of picklable values, so a checker process can run them
(:mod:`service.app.checker`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from service.planning import plan_hash, search_hash, solve_hash, validate_plan
from service.submissions import BadRequest, PlanSubmission, SearchSubmission, canonical_plan_request

PLAN, SOLVE, SEARCH = "plan", "solve", "search"
MAX_FREE_DEPTH = 32
"""Nesting of a free-form value (a graph document nests about 12 deep: values 8 inside its nodes)."""
_UNION_TAGS = ("preset", "figures", "int", "float", "bool", "str")
"""Tags pydantic puts in an error's location inside a union (the schemas' discriminated ones, and the plain
members of ``int | float | bool | str``): not part of the field's name."""
_UNION_TAG_PREFIXES = ("literal[", "function-", "constrained-", "dict[", "list[")


@dataclass(frozen=True)
class Intake:
    """A submission read: what keys, stores and bounds its job."""

    kind: str
    key: str
    """The content hash: the job's ``problem_hash`` (a plan or solve's result is stored under it)."""
    request: str
    """The canonical request, JSON text: what the job stores and its worker runs."""
    solver_s: float
    """Solver seconds the job asks for (a search: the time limit times its candidates)."""
    candidates: int = 1


@dataclass(frozen=True)
class Limits:
    """The service's caps a check applies (from its settings)."""

    max_graph_bytes: int
    max_time_limit_s: float
    max_search_candidates: int
    max_job_solver_s: float


def canonical_text(request: dict[str, Any]) -> str:
    return json.dumps(request, sort_keys=True, separators=(",", ":"), allow_nan=False)


# ---------------------------------------------------------------------------------------------- reading


def read_plan(body: bytes) -> Intake:
    """``POST /v1/plans``: the submission, its graph bounded, keyed by :func:`plan_hash`."""
    submission = parse(PlanSubmission, body)
    if submission.graph is not None:
        check_free_form(submission.graph, "graph")
    request = canonical_plan_request(submission)
    return Intake(PLAN, plan_hash(request), canonical_text(request), submission.solver.time_limit_s)


def read_solve(body: bytes, options: dict[str, Any]) -> Intake:
    """``POST /v1/solve``: an IOPDDL document read strictly (unknown fields refused by name) and stored in its
    canonical form, keyed by the problem's content hash and the solver ``options``."""
    from solver.errors import ProblemError
    from solver.iopddl import from_dict, to_dict

    document = parse_json(body)
    try:
        problem = from_dict(document, strict=True)
    except ProblemError as error:
        raise BadRequest(error.field, error.message) from error
    request = {"problem": to_dict(problem), "options": options}
    return Intake(
        SOLVE, solve_hash(problem.content_hash, options), canonical_text(request), options["time_limit_s"]
    )


def read_search(body: bytes) -> Intake:
    """``POST /v1/searches``: the search, its candidates counted; keyed by :func:`search_hash` of its
    canonical form (a resubmission joins the search running; a search is never answered from an earlier
    one's results)."""
    from service.search.candidates import make_candidates

    submission = parse(SearchSubmission, body)
    request = submission.model_dump(mode="json")
    text = canonical_text(request)
    try:
        made = make_candidates(
            submission.devices, submission.batch_sizes, None, submission.max_mesh_dims, submission.axis_limits
        )
    except ValueError as error:
        raise BadRequest("axis_limits", str(error)) from None
    candidates = len(made)
    return Intake(SEARCH, search_hash(request), text, submission.solver.time_limit_s * candidates, candidates)


def parse(model: type[BaseModel], body: bytes) -> Any:
    """``model`` from a JSON body (parsed and validated in one pass, nesting bounded by the parser); the
    first error names its field."""
    try:
        return model.model_validate_json(body)
    except ValidationError as error:
        raise bad_request_of(error) from None


def parse_json(body: bytes) -> Any:
    """A JSON body (non-finite numbers refused, nesting bounded), for documents without a schema."""
    from pydantic_core import from_json

    try:
        value = from_json(body, allow_inf_nan=False)
    except ValueError as error:
        raise BadRequest("body", f"malformed JSON: {error}") from None
    check_free_form(value, "body")
    return value


def bad_request_of(error: ValidationError) -> BadRequest:
    """The first validation error as a BadRequest: ``mesh.shape[0]: Input should be ...``."""
    first = error.errors(include_url=False)[0]
    if first.get("type") == "json_invalid":
        return BadRequest("body", f"malformed JSON: {first.get('msg')}")
    field = field_of(tuple(first.get("loc", ())))
    if first.get("type") == "extra_forbidden":
        return BadRequest(field, "unknown field")
    return BadRequest(field, str(first.get("msg")))


def field_of(location: tuple) -> str:
    """``("mesh", "shape", 0)`` -> ``mesh.shape[0]``; union member tags (``int``, ``literal[...]``) are
    left out. Empty: ``body``."""
    text = ""
    for part in (str(p) for p in location):
        if text and (part in _UNION_TAGS or part.startswith(_UNION_TAG_PREFIXES)):
            continue
        text += f"[{part}]" if part.isdigit() else (f".{part}" if text else part)
    return text or "body"


def check_free_form(value: Any, field: str, max_depth: int = MAX_FREE_DEPTH) -> None:
    """Refuse a free-form JSON value nested deeper than ``max_depth`` or holding a non-finite number (a
    parser may read ``1e400`` as infinity): stored, hashed and handed to workers, either breaks them."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            if isinstance(item, float) and not math.isfinite(item):
                raise BadRequest(field, "holds a non-finite number")
            continue
        if depth > max_depth:
            raise BadRequest(field, f"nested more than {max_depth} deep")
        stack.extend((child, depth + 1) for child in children)


# --------------------------------------------------------------------------------------------- checking


def check(intake: Intake, limits: Limits) -> None:
    """Everything about ``intake`` that needs the model or the graph (:func:`check_caps` comes first)."""
    request = json.loads(intake.request)
    if intake.kind == PLAN:
        validate_plan(request, limits.max_graph_bytes, limits.max_time_limit_s)
    elif intake.kind == SEARCH:
        check_search(request)


def check_caps(intake: Intake, limits: Limits) -> None:
    """The per-job caps: a time limit, a search's candidates and its total solver seconds."""
    time_field = "time_limit_s" if intake.kind == SOLVE else "solver.time_limit_s"
    per_candidate = intake.solver_s / intake.candidates
    if per_candidate > limits.max_time_limit_s:
        raise BadRequest(time_field, f"at most {limits.max_time_limit_s:g} s")
    if intake.kind != SEARCH:
        return
    if intake.candidates > limits.max_search_candidates:
        raise BadRequest(
            "batch_sizes",
            f"{intake.candidates} candidates (meshes x batch sizes): at most {limits.max_search_candidates}; "
            "fewer devices, mesh axes or batch sizes",
        )
    if intake.solver_s > limits.max_job_solver_s:
        raise BadRequest(
            time_field,
            f"{intake.candidates} candidates x {per_candidate:g} s = {intake.solver_s:g} solver seconds: "
            f"at most {limits.max_job_solver_s:g} per job",
        )


def check_search(request: dict[str, Any]) -> None:
    """A search's model and options: the model built on the meta device for its first batch size."""
    from strategies.models import MODELS

    if request["model"] not in MODELS:
        raise BadRequest("model", f"unknown model {request['model']!r}; built-in models are {sorted(MODELS)}")
    from service.planning import parameter_bytes

    parameter_bytes({**request, "batch": request["batch_sizes"][0]})
