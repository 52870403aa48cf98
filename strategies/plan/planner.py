"""Plan a model end to end: build it on the meta device, capture one step, build the problem, solve, plan.

Each phase is timed (``timings`` in the plan) and reported to an optional progress callback.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from solver.errors import InfeasibleError
from solver.headroom import with_headroom
from solver.problem import Problem
from solver.solve import SolveOptions, SolveResult, solve
from strategies.cost.mesh import Mesh, make_mesh
from strategies.graph.passes import capture_for_planning
from strategies.placement import parse_spec
from strategies.plan.plan_json import earned_credit, make_plan, predict
from strategies.plan.request import DEFAULT_BATCH as DEFAULT_BATCH
from strategies.plan.request import DEFAULT_CAPTURED_LAYERS as DEFAULT_CAPTURED_LAYERS
from strategies.plan.request import DEFAULT_GAP as DEFAULT_GAP
from strategies.plan.request import DEFAULT_SEQ as DEFAULT_SEQ
from strategies.plan.request import PIPELINE_AXIS, PlanOutcome, PlanRequest, request_record
from strategies.problem.builder import (
    COST_UNIT_S,
    BuiltProblem,
    ProblemOptions,
    build_problem,
    first_credit,
    recredit,
)
from strategies.problem.layer_repeat import MIN_CAPTURED, LayerRepeat
from strategies.problem.recompute import AUTO
from strategies.problem.recompute import NONE as NO_RECOMPUTE
from strategies.units import bytes_text

if TYPE_CHECKING:
    from strategies.graph.capture import JointGraph
    from strategies.models import ModelSpec

Progress = Callable[[str], None]
SOLVER_THREADS = 2
"""Cores one plan's solve uses (the machines this runs on have two)."""
HEADROOM_SHARE = 0.5
AUTO_RECOMPUTE_PEAK_SHARE = 0.9
"""``recompute=auto`` plans with recomputation only where the plan without it peaks above this share of the
limit (or nothing fits): below, memory does not bind and recomputation could only add time."""
MIN_SECOND_SOLVE_S = 1.0
"""... and that second solve gets the time left, at least this long; where less is left and the first solve
found a plan, there is no second solve (a search's short limits: the second build and solve took 4-9 s of
a 2 s limit on 3-D meshes, and their plans with recomputation were not faster)."""
HEADROOM_MIN_S = 1.0
"""After the time-optimal solve, the headroom pass (:mod:`solver.headroom`: the least peak within the gap)
gets half the time that solve took, at least `HEADROOM_MIN_S`, never past the request's time limit, and runs
only where that limit leaves `HEADROOM_MIN_S` and a probe's worth (as long as the solve so far) ... (a
search's 2 s limits: the pass took 1-2 s more per 3-D candidate, its probes overrunning what was left)"""
HEADROOM_PEAK_SHARES = (0.25, 0.95)
"""... and only where the fastest plan's peak is between these shares of the memory limit (the budget, else
the device's memory): below, three quarters of the memory are free already and the probes (~1 s each, even
on tiny models) would buy little; above, memory already binds -- the budget the user set is the headroom
they chose, and probes under a binding limit are the slowest solves there are (the zoo's half-memory
plans)."""


class PrunedError(RuntimeError):
    """No plan of the request costs less than its ``cutoff_s``: the solve's bound (``bound_s``, the program's
    step seconds) proves it."""

    def __init__(self, bound_s: float, cutoff_s: float) -> None:
        super().__init__(
            f"pruned: no plan costs less than {1e3 * bound_s:.6g} ms per step (the bound), above the cutoff "
            f"of {1e3 * cutoff_s:.6g} ms"
        )
        self.bound_s = bound_s
        self.cutoff_s = cutoff_s


def plan_model(request: PlanRequest, progress: Progress | None = None) -> PlanOutcome:
    """Capture, build, solve and write the plan of ``request``."""
    say = progress or (lambda message: None)
    timings: dict[str, float] = {}
    mesh = make_mesh(request.mesh, request.axis_names, request.hardware)
    if PIPELINE_AXIS in mesh.axis_names:
        from strategies.plan.pipeline_plan import plan_pipeline

        return plan_pipeline(request, mesh, say, plan_model)
    if request.microbatches is not None or request.schedule is not None:
        raise ValueError(
            f"microbatches / schedule: only for a pipeline (an axis named {PIPELINE_AXIS} first)"
        )
    _check_baseline(request.baseline, mesh)
    compute_dtype(request)  # a bad name refused before any work
    started = time.perf_counter()
    first = _first_policy(request)
    if request.graph is not None:
        build = _load(request, mesh, say, timings)
        built = build(first)
    else:
        repeat = _layer_repeat(request)
        try:
            build = _capture(request, mesh, repeat, say, timings)
            built = build(first)
        except RepeatMismatch as error:
            say(f"{error}: capturing every layer")
            build = _capture(request, mesh, None, say, timings)
            built = build(first)
    return _solve_and_plan(request, mesh, build, built, say, timings, started)


def plan_captured(
    request: PlanRequest,
    graph: JointGraph,
    repeat: LayerRepeat | None,
    progress: Progress | None = None,
    threads: int = SOLVER_THREADS,
) -> PlanOutcome:
    """Plan ``request`` from a step captured (or loaded from a graph document) before: build the problem on
    the request's mesh, solve, plan. A search captures once per model configuration and plans every mesh
    from it; the plan equals :func:`plan_model`'s of the same request. ``threads``: cores the solver may use
    (a search running several candidates at once gives each its share)."""
    say = progress or (lambda message: None)
    timings: dict[str, float] = {}
    mesh = make_mesh(request.mesh, request.axis_names, request.hardware)
    if PIPELINE_AXIS in mesh.axis_names:
        raise ValueError(
            f"axis_names: a pipeline ({PIPELINE_AXIS}) is planned with plan_model, not from a capture"
        )
    _check_baseline(request.baseline, mesh)
    compute_dtype(request)  # a bad name refused before any work
    started = time.perf_counter()

    def build(policy: str) -> BuiltProblem:
        return _build(graph, request, mesh, repeat, say, timings, policy)

    built = build(_first_policy(request))
    return _solve_and_plan(request, mesh, build, built, say, timings, started, threads)


def _first_policy(request: PlanRequest) -> str:
    """The recomputation the first solve plans with: ``auto`` starts without (`_solve_and_plan`)."""
    return NO_RECOMPUTE if request.recompute == AUTO else request.recompute


def _solve_and_plan(
    request: PlanRequest,
    mesh: Mesh,
    build: Callable[[str], BuiltProblem],
    built: BuiltProblem,
    say: Progress,
    timings: dict[str, float],
    started: float,
    threads: int = SOLVER_THREADS,
) -> PlanOutcome:
    """Solve ``built`` (made by ``build`` with `_first_policy`) and plan. Under ``recompute=auto`` the first
    solve has no recomputation: where its plan leaves memory free (its peak under `AUTO_RECOMPUTE_PEAK_SHARE`
    of the limit), recomputation could only add time, and that plan is the answer; where memory binds (or
    nothing fits), the problem with recomputation is built and solved in the time left, and the faster plan
    wins; with less than `MIN_SECOND_SOLVE_S` left and a plan found, that plan is the answer.
    (Recomputation on every plan made 4x4x4 plans 3x slower to solve for nothing.)"""
    phase = time.perf_counter()
    try:  # under `auto` an infeasible first problem is built again with recomputation: no need to explain it
        explain = request.recompute != AUTO
        result, problem = _solve_built(request, built, say, threads, request.time_limit, explain)
    except InfeasibleError as error:
        if request.recompute != AUTO:
            raise _budget_error(error, request, mesh) from error
        result, problem, failure = None, None, error
    bound = None if result is None else result.bound  # the least cost of the plans solved for, proven
    limit = built.problem.usage_limit
    peak = None if result is None else result.peak_usage
    binds = peak is None or (limit and peak > AUTO_RECOMPUTE_PEAK_SHARE * limit)
    left = request.time_limit - (time.perf_counter() - phase)
    if request.recompute == AUTO and binds and result is not None and left < MIN_SECOND_SOLVE_S:
        say(f"memory binds, but {max(left, 0.0):.1f} s of the time limit is left: no plan with recomputation")
    elif request.recompute == AUTO and binds:
        say("memory binds: planning with activation recomputation")
        left = max(left, MIN_SECOND_SOLVE_S)
        again = build(AUTO)
        try:
            second, second_problem = _solve_built(request, again, say, threads, left)
        except InfeasibleError as error:
            if result is None:
                raise _budget_error(error, request, mesh) from error
        else:
            bound = second.bound  # its program holds the first's plans too (each node may keep its values)
            if result is None or (second.cost is not None and second.cost < result.cost):
                result, problem, built = second, second_problem, again
    _check_cutoff(request, bound)
    if result is None:
        raise _budget_error(failure, request, mesh) from failure
    result, problem, built = _recredited(request, built, result, problem, say, threads, phase)
    fastest = result
    spent = time.perf_counter() - phase
    left = request.time_limit - spent
    if (
        request.baseline is None
        and _wants_headroom(result, problem.usage_limit)
        and left >= HEADROOM_MIN_S + spent
    ):
        budget = min(left, max(HEADROOM_MIN_S, HEADROOM_SHARE * spent))
        say(f"headroom: the least peak within {100 * request.gap:g}% of the bound ({budget:.1f} s at most)")
        fastest_step_s = predict(built, np.asarray(result.solution, dtype=np.int64))["step_time_s"]

        def simulated_within_gap(answer: SolveResult) -> bool:
            step_s = predict(built, np.asarray(answer.solution, dtype=np.int64))["step_time_s"]
            return bool(step_s <= fastest_step_s * (1.0 + request.gap))

        options = SolveOptions(
            backend=request.backend, time_limit=budget, threads=threads, relative_gap=request.gap
        )
        result = with_headroom(problem, result, options, accept=simulated_within_gap).result
    timings["solve"] = time.perf_counter() - phase
    plan = make_plan(built, result, request=request_record(request), fastest=fastest)
    plan["timings"] = {**timings, "total": time.perf_counter() - started}
    return PlanOutcome(plan, built, result, timings)


def _check_cutoff(request: PlanRequest, bound: float | None) -> None:
    """Stop planning (:class:`PrunedError`) where the bound (the program's, in `COST_UNIT_S`) proves no plan
    costs less than the request's cutoff: the re-credit and headroom passes are not run for a plan the
    caller has no use for."""
    if request.cutoff_s is not None and bound is not None and bound * COST_UNIT_S > request.cutoff_s:
        raise PrunedError(bound * COST_UNIT_S, request.cutoff_s)


def _recredited(
    request: PlanRequest,
    built: BuiltProblem,
    result: SolveResult,
    problem: Problem,
    say: Progress,
    threads: int,
    phase: float,
) -> tuple[SolveResult, Problem, BuiltProblem]:
    """Solve, simulate, re-credit: while the share of parameter gathers and gradient reductions the simulated
    plan hides (less what hiding costs) differs from the credit it was solved with by more than
    `RECREDIT_STEP`, solve again under the simulated credit (at most `RECREDIT_ROUNDS` times, in the time
    left); the plan of shorter simulated step time is kept."""
    if built.mesh.hardware.overlap_slowdown >= 1.0:  # hiding gains nothing: no credit to earn
        return result, problem, built
    predicted = predict(built, np.asarray(result.solution, dtype=np.int64))
    for _ in range(RECREDIT_ROUNDS):
        credit = earned_credit(built, predicted)
        moved = max((abs(share - built.credit.get(role, 0.0)) for role, share in credit.items()), default=0.0)
        left = request.time_limit - (time.perf_counter() - phase)
        if moved <= RECREDIT_STEP or left < MIN_SECOND_SOLVE_S:
            break
        say("overlap credit " + ", ".join(f"{role} {share:.2f}" for role, share in sorted(credit.items())))
        again = recredit(built, credit)
        try:
            second, second_problem = _solve_built(request, again, say, threads, left)
        except InfeasibleError:
            break
        second_predicted = predict(again, np.asarray(second.solution, dtype=np.int64))
        if second_predicted["step_time_s"] >= predicted["step_time_s"]:
            break
        result, problem, built, predicted = second, second_problem, again, second_predicted
    return result, problem, built


def _solve_built(
    request: PlanRequest,
    built: BuiltProblem,
    say: Progress,
    threads: int,
    time_limit: float,
    explain: bool = True,
) -> tuple[SolveResult, Problem]:
    """The solve of a built problem (the request's baseline pinned), and the problem solved; ``explain``: an
    infeasible one names its smallest peak (`solver.solve`'s ``explain_infeasible``) where the request asks
    for it (``exact_min_peak``)."""
    problem = built.problem
    if request.baseline is not None:
        from strategies.plan.baselines import baseline_problem

        problem = baseline_problem(request.baseline, built)
    say(f"solving: {problem.summary()}")
    result = solve(
        problem,
        SolveOptions(
            backend=request.backend,
            time_limit=time_limit,
            threads=threads,
            relative_gap=request.gap,
            cutoff=None if request.cutoff_s is None else request.cutoff_s / COST_UNIT_S,
            explain_infeasible=explain and request.exact_min_peak,
        ),
        progress=lambda p, t, cost, bound: say(f"  {p} {t:6.1f}s incumbent {cost:.6g} bound {bound:.6g}"),
    )
    return result, problem


RECREDIT_STEP = 0.15
"""Re-solve when the simulated credit of a role moved by more than this from the credit solved with."""
RECREDIT_ROUNDS = 2
"""At most this many solves after the first to make the credit hold."""


def _wants_headroom(result: SolveResult, limit: int | None) -> bool:
    """Whether the headroom pass runs after ``result`` (`HEADROOM_PEAK_SHARES`)."""
    if result.solution is None or result.peak_usage is None or not limit:
        return False
    low, high = HEADROOM_PEAK_SHARES
    return low * limit <= result.peak_usage <= high * limit


def _check_baseline(name: str | None, mesh: Mesh) -> None:
    """Refuse an unknown hand-written layout, or one the mesh cannot hold, before any work."""
    from strategies.plan.baselines import BASELINES

    if name is not None and name not in BASELINES:
        raise ValueError(f"baseline: unknown layout {name!r}; choose one of {', '.join(BASELINES)}")
    if name in ("fsdp_tp", "hsdp") and mesh.ndim < 2:
        raise ValueError(f"baseline: {name} needs a mesh of 2 or more axes")


def _budget_error(error: InfeasibleError, request: PlanRequest, mesh: Mesh) -> InfeasibleError:
    """The solver's infeasibility in the user's terms: the budget as it was given (GiB, or the hardware's
    capacity) and the smallest peak per device any plan can reach."""
    if error.min_peak is None:
        return error
    if request.memory_gib is not None:
        budget = f"the budget of {request.memory_gib:g} GiB"
    else:
        budget = f"the {mesh.hardware.name}'s capacity of {bytes_text(mesh.hardware.memory_bytes)}"
    qualifier = "" if error.min_peak_exact else "at least "
    return InfeasibleError(
        f"no plan fits {budget} per device: the smallest peak any plan can reach is "
        f"{qualifier}{bytes_text(error.min_peak)} per device",
        min_peak=error.min_peak,
        min_peak_exact=error.min_peak_exact,
    )


class RepeatMismatch(ValueError):
    """The captured middle layers are not identical, so they cannot stand for the whole stack."""


def _layer_repeat(request: PlanRequest) -> LayerRepeat | None:
    """The short capture standing for a deep built-in language model, when the request allows one."""
    from strategies.models import model_layers

    if not request.share_layers or request.captured_layers is None:
        return None
    total = request.layers if request.layers is not None else model_layers(request.model, **request.options)
    captured = max(request.captured_layers, MIN_CAPTURED)
    if total is None or total <= captured:
        return None
    return LayerRepeat(captured, total)


def build_request_model(request: PlanRequest, model: str, layers: int | None, device: str) -> ModelSpec:
    """``model`` (the request's, or the one a run names) built with the request's shapes, dtype and options,
    ``layers`` deep, on ``device``; a factory fixes its own."""
    from strategies.models import load_model
    from strategies.tensor_meta import parse_dtype

    return load_model(
        model,
        batch=request.batch or DEFAULT_BATCH,
        seq=request.seq or DEFAULT_SEQ,
        dtype=parse_dtype(request.dtype),
        layers=layers,
        device=device,
        **request.options,
    )


def capture_request(
    request: PlanRequest,
    layers: int | None,
    device: str = "meta",
    say: Progress | None = None,
    depth: str = "",
) -> tuple[JointGraph, ModelSpec]:
    """The model of ``request`` built on ``device`` (``layers`` deep; a factory fixes its own) and its
    training step captured and rewritten as the planner plans it: the runtime captures the same graph.
    ``depth`` is said after the model's name (``" (4 of its 32 layers)"``)."""
    say = say or (lambda message: None)
    factory = ":" in request.model
    if factory:
        say(f"building {request.model} (the factory fixes its device, shapes and dtype)")
        ignored = [name for name in ("seq", "layers") if getattr(request, name) is not None]
        if ignored:
            say(f"  ignored for a factory model: {', '.join(ignored)}")
    else:
        say(f"building {request.model}{depth} on the {device} device")
    spec = build_request_model(request, request.model, layers, device)
    if factory and request.batch is not None:
        from strategies.graph.capture import first_rows
        from strategies.models.builder import factory_batch

        own = factory_batch(spec)
        if request.batch < own and own % request.batch == 0:  # a pipeline's micro-batch of the factory's
            say(f"  the first {request.batch} of the factory's {own} rows")
            spec = dataclasses.replace(spec, example_inputs=first_rows(spec.example_inputs, request.batch))
        elif request.batch != own:
            say(f"  ignored for a factory model: batch {request.batch} (its own is {own})")
    say("capturing the joint forward + backward graph")
    return capture_for_planning(spec.module, spec.example_inputs, spec.loss_fn, compute_dtype(request)), spec


def compute_dtype(request: PlanRequest) -> torch.dtype | None:
    """The request's compute dtype (None: the parameters'); ValueError naming ``compute_dtype``."""
    from strategies.tensor_meta import parse_compute_dtype

    return None if request.compute_dtype is None else parse_compute_dtype(request.compute_dtype)


def export_request_graph(request: PlanRequest, say: Progress | None = None) -> dict[str, Any]:
    """The graph document (:mod:`strategies.graph.export`) of the request's model, captured exactly as
    :func:`plan_model` captures it: a deep built-in model short (its layer repeat in the document), every
    layer when its middle layers turn out not to be identical. Planning the document gives the same plan."""
    from strategies.graph.export import graph_document
    from strategies.problem.builder import tied_middle_layers

    say = say or (lambda message: None)
    if request.graph is not None:
        raise ValueError("graph: the request already holds a graph; name a model to export")
    repeat = _layer_repeat(request)
    depth = f" ({repeat.captured} of its {repeat.total} layers)" if repeat is not None else ""
    graph, _ = capture_request(request, repeat.captured if repeat else request.layers, say=say, depth=depth)
    if repeat is not None and len(tied_middle_layers(graph.gm, graph.module_path)) != repeat.captured - 2:
        say("the middle layers of the capture are not identical: capturing every layer")
        repeat = None
        graph, _ = capture_request(request, request.layers, say=say)
    return graph_document(graph, repeat=repeat, model=request.model)


def _load(
    request: PlanRequest, mesh: Mesh, say: Progress, timings: dict[str, float]
) -> Callable[[str], BuiltProblem]:
    """Read the request's graph document (refused with a GraphFormatError naming the field); returns the
    builder of its problem (by recomputation policy). ``timings`` gets the seconds of the load and builds."""
    from strategies.graph.graph_format import FIXED_BY_GRAPH, GraphFormatError, check_beside_graph
    from strategies.graph.imported import load_graph

    check_beside_graph({name: getattr(request, name) for name in FIXED_BY_GRAPH})
    if request.model:
        raise ValueError("model: give a model or a graph, not both")
    started = time.perf_counter()
    say("reading the graph document")
    imported = load_graph(request.graph)
    repeat = imported.repeat
    if repeat is not None and not request.share_layers:
        raise ValueError(
            f"share_layers: the graph holds {repeat.captured} of {repeat.total} layers, which stand for the "
            "stack only when layers are shared"
        )
    timings["load"] = time.perf_counter() - started

    def build(policy: str) -> BuiltProblem:
        try:
            return _build(imported.graph, request, mesh, repeat, say, timings, policy)
        except RepeatMismatch as error:
            raise GraphFormatError("layers", f"{error}; export every layer") from None

    return build


def _capture(
    request: PlanRequest,
    mesh: Mesh,
    repeat: LayerRepeat | None,
    say: Progress,
    timings: dict[str, float],
) -> Callable[[str], BuiltProblem]:
    """Build the model on meta and capture its step; returns the builder of its problem (by recomputation
    policy). ``timings`` gets the seconds of the capture (including building the model) and of each build."""
    started = time.perf_counter()
    depth = f" ({repeat.captured} of its {repeat.total} layers)" if repeat is not None else ""
    layers = repeat.captured if repeat is not None else request.layers
    graph, _ = capture_request(request, layers, say=say, depth=depth)
    timings["capture"] = time.perf_counter() - started
    return lambda policy: _build(graph, request, mesh, repeat, say, timings, policy)


def _build(
    graph: JointGraph,
    request: PlanRequest,
    mesh: Mesh,
    repeat: LayerRepeat | None,
    say: Progress,
    timings: dict[str, float],
    recompute: str,
) -> BuiltProblem:
    """The problem of a captured (or loaded) step under the request's budget, pins and options, with the
    recomputation policy ``recompute``."""
    phase = time.perf_counter()
    limit = int(request.memory_gib * 2**30) if request.memory_gib is not None else mesh.hardware.memory_bytes
    say(f"building the problem on {mesh}")
    try:
        options = ProblemOptions(
            memory_limit=limit,
            input_placements={int(i): parse_spec(p) for i, p in request.input_placements.items()},
            parameter_placements={
                (repeat.captured_name(n) if repeat is not None else n): parse_spec(p)
                for n, p in request.parameter_placements.items()
            },
            credit=first_credit(mesh),
            share_layers=request.share_layers,
            repeat=repeat,
            recompute=recompute,
            parameter_memory_share=request.parameter_memory_share,
        )
        built = build_problem(graph, mesh, options)
    except ValueError as error:
        if repeat is not None and str(error).startswith("layer repeat"):
            raise RepeatMismatch(str(error)) from error
        raise
    timings["build"] = time.perf_counter() - phase
    return built
