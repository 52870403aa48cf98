"""What the service plans and solves: requests checked and hashed in the API, run in worker processes.

The API process validates a submission (:func:`validate_plan`, :func:`validate_solve`) and keys it by a
content hash of everything that changes the answer (:func:`plan_hash`, :func:`solve_hash`); a worker
process runs it (:func:`run_plan_job`, :func:`run_solve_job`). A launcher's graph document (instead of a
built-in model) is read in the API process as the planner will read it (:func:`check_graph`), so a bad one is
refused at once naming its field; the worker plans from it without importing any model code.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from collections.abc import Callable
from typing import Any

from service.app.schemas import PlanSubmission

HASH_SALT = "autoshard-service-v1"
Report = Callable[[dict[str, Any]], None]
"""Receives progress: ``{"phase", "incumbent", "bound", "gap", "elapsed_s"}``."""


class BadRequest(ValueError):
    """A request the service refuses (``status``: 422, or 413 for a graph past the service's bounds);
    ``field`` names the offending field of the body."""

    def __init__(self, field: str, message: str, status: int = 422) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message
        self.status = status


# -------------------------------------------------------------------------------------------- hashing


def canonical_plan_request(submission: PlanSubmission) -> dict[str, Any]:
    """The submission with every default filled in, as stored with its job (JSON-ready)."""
    return submission.model_dump(mode="json")


def plan_hash(request: dict[str, Any]) -> str:
    """sha256 of the canonical request: equal requests (defaults included) share one plan."""
    text = json.dumps(request, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(f"{HASH_SALT}:plan:{text}".encode()).hexdigest()


def solve_hash(problem_hash: str, options: dict[str, Any]) -> str:
    """The problem's own content hash (``Problem.content_hash``) with the solver options."""
    text = json.dumps(options, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(f"{HASH_SALT}:solve:{problem_hash}:{text}".encode()).hexdigest()


# ----------------------------------------------------------------------------------------- validation


def check_graph(graph: dict[str, Any], max_bytes: int) -> int:
    """A launcher's graph document (docs/graph-format.md) read as the planner will read it, within the
    service's byte bound; refusals name the field under ``graph`` (413 past a bound). Returns the bytes of
    the parameters it holds (a short capture: those of the captured layers, a lower bound)."""
    from strategies.graph.graph_format import GraphFormatError, GraphLimits
    from strategies.graph.imported import load_graph

    size = len(json.dumps(graph, separators=(",", ":")))
    if size > max_bytes:
        raise BadRequest("graph", f"{size} bytes of JSON, more than the limit of {max_bytes}", status=413)
    try:
        imported = load_graph(graph, GraphLimits(max_bytes=max_bytes))
    except GraphFormatError as error:
        raise BadRequest(f"graph.{error.field}", error.message, status=error.status) from error
    values = (node.meta["val"] for node in imported.graph.parameters.values())
    return sum(value.numel() * value.element_size() for value in values)


def validate_plan(request: dict[str, Any], max_graph_bytes: int, max_time_limit_s: float) -> None:
    """Refuse what can be refused before any work, naming the field: the model, its options and shapes,
    the mesh, hardware, pinned placements, the time limit, and a memory budget below the parameters'
    smallest share per device. Builds the model on the meta device (no memory)."""
    from strategies.cost.hardware import override_hardware
    from strategies.cost.mesh import make_mesh
    from strategies.graph.graph_format import FIXED_BY_GRAPH, check_beside_graph
    from strategies.models import MODELS
    from strategies.placement import parse_spec

    has_model, has_graph = request["model"] is not None, request["graph"] is not None
    if has_model == has_graph:
        raise BadRequest("model", "give exactly one of model (a built-in name) or graph")
    if has_graph:
        try:
            check_beside_graph(request)
        except ValueError as error:
            raise _named(error, {name: name for name in FIXED_BY_GRAPH}) from error
    elif request["model"] not in MODELS:
        raise BadRequest("model", f"unknown model {request['model']!r}; built-in models are {sorted(MODELS)}")
    if request["solver"]["time_limit_s"] > max_time_limit_s:
        raise BadRequest("solver.time_limit_s", f"at most {max_time_limit_s:g} s")
    mesh_spec = request["mesh"]
    hardware = request["hardware"]
    try:
        if isinstance(hardware, dict):
            hardware = override_hardware(hardware)
        mesh = make_mesh(mesh_spec["shape"], mesh_spec["axis_names"], hardware)
    except ValueError as error:
        raise _named(error, {"mesh": "mesh.shape", "axis_names": "mesh.axis_names"}) from error
    if math.prod(mesh.shape) > 2**20:
        raise BadRequest("mesh.shape", f"{math.prod(mesh.shape)} devices: at most {2**20}")
    for group, pins in request["pinned"].items():
        for key, placement in pins.items():
            if len(placement) != len(mesh.shape):
                raise BadRequest(f"pinned.{group}.{key}", f"one placement per mesh axis ({len(mesh.shape)})")
            try:
                parse_spec(placement)
            except ValueError as error:
                raise BadRequest(f"pinned.{group}.{key}", str(error)) from error
    if request["baseline"] == "fsdp_tp" and len(mesh.shape) < 2:
        raise BadRequest("baseline", "fsdp_tp needs a mesh of 2 or more axes")
    if has_graph:
        parameter_bytes = check_graph(request["graph"], max_graph_bytes)
    else:
        parameter_bytes = _parameter_bytes(request)
    _check_budget(request["memory_gib"], parameter_bytes / math.prod(mesh.shape), mesh.hardware.memory_bytes)


def _parameter_bytes(request: dict[str, Any]) -> int:
    """The model's parameter bytes (built on the meta device); bad options or shapes name their field."""
    from strategies.models import build_model
    from strategies.tensor_meta import parse_dtype

    try:
        spec = build_model(
            request["model"],
            batch=request["batch"] or 8,
            seq=request["seq"] or 1024,
            dtype=parse_dtype(request["dtype"]),
            layers=request["layers"],
            device="meta",
            **request["options"],
        )
    except (ValueError, TypeError) as error:
        raise _named(error, {"model": "options"}) from error
    return sum(p.numel() * p.element_size() for p in spec.module.parameters())


def _check_budget(memory_gib: float | None, smallest_share: float, capacity: int) -> None:
    """Every plan holds at least its share of the parameters on each device: a budget below that (or a
    device smaller than it) cannot be met."""
    budget = capacity if memory_gib is None else memory_gib * 2**30
    if smallest_share > budget:
        field = "memory_gib" if memory_gib is not None else "hardware"
        raise BadRequest(
            field,
            f"infeasible: the parameters alone need at least {smallest_share / 2**30:.3g} GiB per device "
            f"(fully sharded), more than the budget of {budget / 2**30:.3g} GiB",
        )


def _named(error: Exception, fields: dict[str, str]) -> BadRequest:
    """A library error ``"field: message"`` as a BadRequest naming the API's field."""
    text = str(error)
    head, sep, rest = text.partition(": ")
    if sep and re.fullmatch(r"[\w.\[\]]+", head):
        return BadRequest(fields.get(head, head), rest)
    return BadRequest(next(iter(fields.values())), text)


# --------------------------------------------------------------------------------------------- running


def run_plan_job(request: dict[str, Any], report: Report | None = None) -> dict[str, Any]:
    """Plan a validated request (see :func:`validate_plan`): the plan JSON. Raises BadRequest for what only
    the work finds wrong, and InfeasibleError when no plan fits the budget."""
    from strategies.cost.hardware import override_hardware
    from strategies.graph.graph_format import GraphFormatError
    from strategies.plan.planner import PlanRequest, plan_model

    hardware = request["hardware"]
    solver = request["solver"]
    plan_request = PlanRequest(
        model=request["model"] or "",
        graph=request.get("graph"),
        mesh="x".join(str(n) for n in request["mesh"]["shape"]),
        axis_names=None if request["mesh"]["axis_names"] is None else ",".join(request["mesh"]["axis_names"]),
        hardware=override_hardware(hardware) if isinstance(hardware, dict) else hardware,  # type: ignore[arg-type]
        memory_gib=request["memory_gib"],
        batch=request["batch"],
        seq=request["seq"],
        layers=request["layers"],
        dtype=request["dtype"],
        backend=solver["backend"],
        time_limit=solver["time_limit_s"],
        gap=solver["gap"],
        overlap=request["overlap"],
        options=dict(request["options"]),
        input_placements={int(k): v for k, v in request["pinned"]["inputs"].items()},
        parameter_placements=dict(request["pinned"]["parameters"]),
        captured_layers=request["captured_layers"] or None,
        baseline=request["baseline"],
    )
    listener = PlanProgress(report)
    try:
        outcome = plan_model(plan_request, progress=listener)
    except GraphFormatError as error:
        raise BadRequest(f"graph.{error.field}", error.message, status=error.status) from error
    except ValueError as error:
        raise _named(
            error, {"model": "options", "mesh": "mesh.shape", "axis_names": "mesh.axis_names"}
        ) from error
    plan = outcome.plan
    plan["request"]["hardware"] = hardware  # figures as sent (not the expanded preset)
    return plan


class PlanProgress:
    """The planner's progress lines as structured progress: phase (capture, build, solve, or the solver's
    own phase) and, while solving, incumbent, bound and gap."""

    SOLVER_LINE = re.compile(r"^\s+(\w+)\s+[\d.]+s incumbent (\S+) bound (\S+)")

    def __init__(self, report: Report | None) -> None:
        self.report = report
        self.started = time.perf_counter()

    def __call__(self, message: str) -> None:
        if self.report is None:
            return
        solver_line = self.SOLVER_LINE.match(message)
        if solver_line:
            phase, incumbent, bound = (
                solver_line.group(1),
                float(solver_line.group(2)),
                float(solver_line.group(3)),
            )
        else:
            phase, incumbent, bound = _planner_phase(message), math.inf, -math.inf
            if phase is None:
                return
        self.report(progress_record(phase, time.perf_counter() - self.started, incumbent, bound))


def _planner_phase(message: str) -> str | None:
    for prefix, phase in (
        ("building the problem", "build"),
        ("building", "capture"),
        ("capturing", "capture"),
        ("solving", "solve"),
    ):
        if message.startswith(prefix):
            return phase
    return None


def progress_record(phase: str, elapsed_s: float, incumbent: float, bound: float) -> dict[str, Any]:
    """Progress as JSON: infinite incumbents and bounds are null; gap = (incumbent - bound) / incumbent."""
    finite_incumbent = incumbent if math.isfinite(incumbent) else None
    finite_bound = bound if math.isfinite(bound) else None
    gap = None
    if finite_incumbent is not None and finite_bound is not None and finite_incumbent != 0:
        gap = max(0.0, (finite_incumbent - finite_bound) / abs(finite_incumbent))
    return {
        "phase": phase,
        "incumbent": finite_incumbent,
        "bound": finite_bound,
        "gap": gap,
        "elapsed_s": round(elapsed_s, 3),
    }


def validate_solve(document: Any) -> Any:
    """An IOPDDL document as a solver Problem; ProblemError becomes a BadRequest naming the field."""
    from solver.errors import ProblemError
    from solver.iopddl import from_dict

    try:
        return from_dict(document)
    except ProblemError as error:
        raise BadRequest(error.field, error.message) from error


def run_solve_job(request: dict[str, Any], report: Report | None = None) -> dict[str, Any]:
    """Solve a bare IOPDDL problem: the result JSON of ``autoshard solve``."""
    from solver.solve import solve

    problem = validate_solve(request["problem"])
    options = request["options"]

    def progress(phase: str, seconds: float, incumbent: float, bound: float) -> None:
        if report is not None:
            report(progress_record(phase, seconds, incumbent, bound))

    result = solve(
        problem,
        backend=options["backend"],
        time_limit=options["time_limit_s"],
        relative_gap=options["gap"],
        threads=1,
        progress=progress,
    )
    return result.to_dict()
