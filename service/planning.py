"""What the service plans and solves: requests checked and hashed before a job exists, run in worker
processes.

A submission is validated (:func:`validate_plan`, called by :mod:`service.intake` in a checker process) and
keyed by a content hash of everything that changes the answer (:func:`plan_hash`, :func:`solve_hash`,
:func:`search_hash`); a worker process runs it (:func:`run_plan_job`, :func:`run_solve_job`). A launcher's
graph document (instead of a built-in model) is read as the planner will read it (:func:`graph_tensors`), so
a bad one is refused at once naming its field; the worker plans from it without importing any model code.
Hardware is a preset name or figures (:func:`service_hardware`): nothing a request names is read from the
server's disk.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from service.submissions import BadRequest, plan_request

HASH_SALT = "autoshard-service-v2"
"""Part of every plan and solve key: the cost model is part of what a stored plan means, so a change of it
(v2: achieved rates and the two-stream schedule) must not answer with plans made under the old one."""
MAX_LAYERS = 1024
"""The deepest model a request may ask for (``layers``, or ``options.n_layers``)."""
Report = Callable[[dict[str, Any]], None]
"""Receives progress: ``{"phase", "incumbent", "bound", "gap", "elapsed_s"}``."""


_PATH = re.compile(r"(?:[A-Za-z]:)?(?:[\\/][\w.@+-]+){2,}[\\/]?")
MAX_MESSAGE = 500


def public_message(error: BaseException) -> str:
    """An unexpected error as a client may read it: its type and first line (a native backtrace follows on
    later lines), file paths replaced by ``<path>``, at most MAX_MESSAGE characters."""
    first_line = (str(error).splitlines() or [""])[0]
    text = f"{type(error).__name__}: {_PATH.sub('<path>', first_line)}"
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 3] + "..."


# -------------------------------------------------------------------------------------------- hashing


def plan_hash(request: dict[str, Any]) -> str:
    """sha256 of the canonical request: equal requests (defaults included) share one plan."""
    return _request_hash("plan", request)


def search_hash(request: dict[str, Any]) -> str:
    """sha256 of the canonical search request: a resubmission joins the search running (a search is never
    answered from an earlier one's results: those are read through its job)."""
    return _request_hash("search", request)


def _request_hash(kind: str, request: dict[str, Any]) -> str:
    text = json.dumps(request, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(f"{HASH_SALT}:{kind}:{text}".encode()).hexdigest()


def solve_hash(problem_hash: str, options: dict[str, Any]) -> str:
    """The problem's own content hash (``Problem.content_hash``) with the solver options."""
    text = json.dumps(options, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(f"{HASH_SALT}:solve:{problem_hash}:{text}".encode()).hexdigest()


# ----------------------------------------------------------------------------------------- validation


def validate_plan(request: dict[str, Any], max_graph_bytes: int, max_time_limit_s: float) -> None:
    """Refuse what can be refused before any work, naming the field: the model, its options and shapes,
    the mesh, hardware, pinned placements (their parameters and inputs must exist, shard dims within their
    tensors), the time limit, and a memory budget below the parameters' smallest share per device. Builds
    the model on the meta device (no memory)."""
    from strategies.cost.mesh import make_mesh
    from strategies.graph.graph_format import FIXED_BY_GRAPH, check_beside_graph
    from strategies.models import MODELS

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
    hardware = service_hardware(request["hardware"])
    try:
        mesh = make_mesh(mesh_spec["shape"], mesh_spec["axis_names"], hardware)
    except ValueError as error:
        raise _named(error, {"mesh": "mesh.shape", "axis_names": "mesh.axis_names"}) from error
    if math.prod(mesh.shape) > 2**20:
        raise BadRequest("mesh.shape", f"{math.prod(mesh.shape)} devices: at most {2**20}")
    if request["baseline"] in ("fsdp_tp", "hsdp") and len(mesh.shape) < 2:
        raise BadRequest("baseline", f"{request['baseline']} needs a mesh of 2 or more axes")
    tensors = graph_tensors(request["graph"], max_graph_bytes) if has_graph else model_tensors(request)
    check_pins(request["pinned"], tensors, len(mesh.shape))
    share = tensors.parameter_bytes / math.prod(mesh.shape)
    _check_budget(request["memory_gib"], share, mesh.hardware.memory_bytes)


def service_hardware(hardware: str | dict[str, Any]) -> Any:
    """The request's hardware: a preset by name or figures over one, never a file (the service reads nothing
    a request names from its disk)."""
    from strategies.cost.hardware import HardwareError, override_hardware, preset_hardware

    try:
        return override_hardware(hardware) if isinstance(hardware, dict) else preset_hardware(hardware)
    except HardwareError as error:
        raise _named(error, {"hardware": "hardware"}) from error


@dataclass
class Tensors:
    """What pins and the budget are checked against: parameter shapes by name, input shapes in order."""

    parameters: dict[str, tuple[int, ...]]
    inputs: list[tuple[int, ...]]
    parameter_bytes: int


def graph_tensors(graph: dict[str, Any], max_bytes: int) -> Tensors:
    """The parameters and inputs of a graph document read as the planner will read it."""
    from strategies.graph.graph_format import GraphFormatError, GraphLimits
    from strategies.graph.imported import load_graph

    size = len(json.dumps(graph, separators=(",", ":")))
    if size > max_bytes:
        raise BadRequest("graph", f"{size} bytes of JSON, more than the limit of {max_bytes}", status=413)
    try:
        imported = load_graph(graph, GraphLimits(max_bytes=max_bytes))
    except GraphFormatError as error:
        raise BadRequest(f"graph.{error.field}", error.message, status=error.status) from error
    values = {name: node.meta["val"] for name, node in imported.graph.parameters.items()}
    return Tensors(
        parameters={name: tuple(value.shape) for name, value in values.items()},
        inputs=[tuple(node.meta["val"].shape) for node in imported.graph.inputs],
        parameter_bytes=sum(value.numel() * value.element_size() for value in values.values()),
    )


def model_tensors(request: dict[str, Any]) -> Tensors:
    """The built-in model of ``request`` on the meta device (no memory); bad options or shapes name their
    field (``options.n_heads``, ``batch``)."""
    from strategies.models import ModelOptionError, build_model
    from strategies.tensor_meta import parse_dtype

    depth = request["options"].get("n_layers")
    if isinstance(depth, int) and depth > MAX_LAYERS:  # a million layers builds for hours, then fits nothing
        raise BadRequest("options.n_layers", f"at most {MAX_LAYERS}")
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
    except ModelOptionError as error:
        raise BadRequest(f"options.{error.option}", error.message) from error
    except (ValueError, TypeError) as error:
        raise _named(error, {"model": "options"}) from error
    except Exception as error:  # a combination the model's own checks missed: never torch's text
        message = f"the model cannot be built with these options ({type(error).__name__})"
        raise BadRequest("options", message) from error
    inputs = spec.example_inputs if isinstance(spec.example_inputs, tuple) else (spec.example_inputs,)
    parameters = dict(spec.module.named_parameters())
    return Tensors(
        parameters={name: tuple(p.shape) for name, p in parameters.items()},
        inputs=[tuple(x.shape) for x in inputs if hasattr(x, "shape")],
        parameter_bytes=sum(p.numel() * p.element_size() for p in parameters.values()),
    )


def parameter_bytes(request: dict[str, Any]) -> int:
    """The bytes of the built-in model's parameters (see :func:`model_tensors`)."""
    return model_tensors(request).parameter_bytes


def check_pins(pinned: dict[str, dict[str, list[str]]], tensors: Tensors, axes: int) -> None:
    """Every pinned placement names an existing parameter or input, has one entry per mesh axis, parses,
    and shards only dims its tensor has."""
    from strategies.placement import parse_spec

    targets = [("inputs", key, _input_shape(tensors, key)) for key in pinned["inputs"]]
    targets += [("parameters", key, tensors.parameters.get(key)) for key in pinned["parameters"]]
    for group, key, shape in targets:
        field = f"pinned.{group}.{key}"
        if shape is None:
            count = f"no input {key} (the model takes {len(tensors.inputs)})"
            raise BadRequest(field, count if group == "inputs" else "no such parameter")
        placement = pinned[group][key]
        if len(placement) != axes:
            raise BadRequest(field, f"one placement per mesh axis ({axes})")
        try:
            spec = parse_spec(placement)
        except ValueError as error:
            raise BadRequest(field, str(error)) from error
        if any(code >= len(shape) for code in spec):
            raise BadRequest(field, f"shards a dim its tensor lacks (shape {list(shape)})")


def _input_shape(tensors: Tensors, key: str) -> tuple[int, ...] | None:
    index = int(key)
    return tensors.inputs[index] if index < len(tensors.inputs) else None


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
    from strategies.graph.graph_format import GraphFormatError
    from strategies.plan.planner import plan_model

    hardware = request["hardware"]
    planned = plan_request(request, service_hardware(hardware))
    listener = PlanProgress(report)
    try:
        outcome = plan_model(planned, progress=listener)
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
    from solver.solve import SolveOptions, solve

    problem = validate_solve(request["problem"])
    options = request["options"]

    def progress(phase: str, seconds: float, incumbent: float, bound: float) -> None:
        if report is not None:
            report(progress_record(phase, seconds, incumbent, bound))

    result = solve(
        problem,
        SolveOptions(
            backend=options["backend"],
            time_limit=options["time_limit_s"],
            relative_gap=options["gap"],
            threads=1,
        ),
        progress=progress,
    )
    return result.to_dict()
