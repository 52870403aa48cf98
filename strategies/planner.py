"""Plan a model end to end: build it on the meta device, capture one step, build the problem, solve, plan.

Each phase is timed (``timings`` in the plan) and reported to an optional progress callback.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from solver.solve import SolveResult, solve
from strategies.graph_passes import expose_sequence_dims
from strategies.mesh import make_mesh
from strategies.placement import parse_spec
from strategies.plan import make_plan
from strategies.problem_builder import BuiltProblem, build_problem

Progress = Callable[[str], None]

DEFAULT_BATCH = 8
DEFAULT_SEQ = 1024


@dataclass
class PlanRequest:
    """What to plan; every field is kept in the plan so it can be explained and reproduced."""

    model: str
    """A built-in model name (``mlp``, ``gpt2-small``, ``llama3-8b``, …) or ``path/file.py:factory``."""
    mesh: str
    """Mesh shape, e.g. ``2x4``."""
    axis_names: str | None = None
    """Comma-separated axis names (default ``dp``, ``dp,tp``, ``dp,cp,tp``)."""
    hardware: str = "h100"
    """Preset name or a JSON/YAML hardware file."""
    memory_gib: float | None = None
    """Per-device memory budget in GiB; ``None``: the hardware's capacity."""
    batch: int | None = None
    """Global batch (default 8)."""
    seq: int | None = None
    """Sequence length (default 1024; ignored by models without one)."""
    layers: int | None = None
    dtype: str = "bfloat16"
    backend: str = "auto"
    time_limit: float = 60.0
    overlap: float = 0.0
    """Fraction of parameter all-gathers and gradient reductions hidden behind compute."""
    options: dict[str, Any] = field(default_factory=dict)
    """Model configuration overrides (``{"d": 8192}`` for ``mlp``, config fields for the language models)."""
    input_placements: dict[int, list[str]] = field(default_factory=dict)
    """Pinned input placements, e.g. ``{0: ["S(0)", "R"]}``: batch over the first axis."""
    parameter_placements: dict[str, list[str]] = field(default_factory=dict)
    share_layers: bool = True
    """Identical transformer layers (all but the first and last) take the same placements."""


@dataclass
class PlanOutcome:
    plan: dict[str, Any]
    built: BuiltProblem
    result: SolveResult
    timings: dict[str, float]


def plan_model(request: PlanRequest, progress: Progress | None = None) -> PlanOutcome:
    """Capture, build, solve and write the plan of ``request``."""
    from strategies.capture import capture_step
    from strategies.models import load_model
    from strategies.tensor_meta import parse_dtype

    say = progress or (lambda message: None)
    timings: dict[str, float] = {}
    mesh = make_mesh(request.mesh, request.axis_names, request.hardware)
    started = time.perf_counter()
    say(f"building {request.model} on the meta device")
    spec = load_model(
        request.model,
        batch=request.batch or DEFAULT_BATCH,
        seq=request.seq or DEFAULT_SEQ,
        dtype=parse_dtype(request.dtype),
        layers=request.layers,
        **request.options,
    )
    say("capturing the joint forward + backward graph")
    graph = capture_step(spec.module, spec.example_inputs, spec.loss_fn)
    expose_sequence_dims(graph.gm)
    graph.refresh()
    timings["capture"] = time.perf_counter() - started
    phase = time.perf_counter()
    limit = int(request.memory_gib * 2**30) if request.memory_gib is not None else mesh.hardware.memory_bytes
    say(f"building the problem on {mesh}")
    built = build_problem(
        graph.gm,
        mesh,
        parameters=graph.parameters,
        gradients=graph.gradients,
        inputs=graph.inputs,
        buffers=graph.buffers,
        loss=graph.loss,
        memory_limit=limit,
        input_placements={int(i): parse_spec(p) for i, p in request.input_placements.items()},
        parameter_placements={n: parse_spec(p) for n, p in request.parameter_placements.items()},
        overlap=request.overlap,
        module_path=graph.module_path,
        share_layers=request.share_layers,
    )
    timings["build"] = time.perf_counter() - phase
    say(f"solving: {built.problem.summary()}")
    phase = time.perf_counter()
    result = solve(
        built.problem,
        backend=request.backend,
        time_limit=request.time_limit,
        progress=lambda p, t, cost, bound: say(f"  {p} {t:6.1f}s incumbent {cost:.6g} bound {bound:.6g}"),
    )
    timings["solve"] = time.perf_counter() - phase
    plan = make_plan(built, result, request=asdict(request))
    plan["timings"] = {**timings, "total": time.perf_counter() - started}
    return PlanOutcome(plan, built, result, timings)
