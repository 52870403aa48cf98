"""What a plan is asked (`PlanRequest`, its defaults) and what planning gives back (`PlanOutcome`).

Apart from the planner so that what plans through it (a pipeline's micro-batch plans,
:mod:`strategies.plan.pipeline_plan`) names the request without importing the planner back.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from strategies.problem.layer_repeat import MIN_CAPTURED
from strategies.problem.recompute import AUTO

if TYPE_CHECKING:
    from solver.solve import SolveResult
    from strategies.problem.builder import BuiltProblem

PIPELINE_AXIS = "pp"
"""An axis of this name (the first) cuts the model into pipeline stages (:mod:`.pipeline_plan`)."""
DEFAULT_BATCH = 8
DEFAULT_SEQ = 1024
DEFAULT_CAPTURED_LAYERS = MIN_CAPTURED
DEFAULT_GAP = 0.01


@dataclass
class PlanRequest:
    """What to plan; every field is kept in the plan so it can be explained and reproduced."""

    model: str
    """A built-in model name (``mlp``, ``gpt2-small``, ``llama3-8b``, …) or ``path/file.py:factory``;
    ``""`` when ``graph`` is given."""
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
    """The parameters' dtype (their gradients' too); Adam's state is fp32 whatever it is."""
    compute_dtype: str | None = None
    """Mixed precision: the step computes on copies of the parameters (and floating inputs) in this dtype,
    as FSDP2's ``MixedPrecisionPolicy(param_dtype=...)`` does; None computes in ``dtype``. With ``graph``:
    the compute dtype the document was exported with (its casts are in it), for the runtime to capture the
    module alike."""
    backend: str = "auto"
    time_limit: float = 60.0
    gap: float = DEFAULT_GAP
    """The solver may stop once its plan is proven within this share of the optimum (0: prove optimality)."""
    options: dict[str, Any] = field(default_factory=dict)
    """Model configuration overrides (``{"d": 8192}`` for ``mlp``, config fields for the language models)."""
    input_placements: dict[int, list[str]] = field(default_factory=dict)
    """Pinned input placements, e.g. ``{0: ["S(0)", "R"]}``: batch over the first axis."""
    parameter_placements: dict[str, list[str]] = field(default_factory=dict)
    share_layers: bool = True
    """Identical transformer layers (all but the first and last) take the same placements."""
    captured_layers: int | None = DEFAULT_CAPTURED_LAYERS
    """Deeper built-in language models are captured with this many layers (first, tied middle copies,
    last) standing for the whole stack (:mod:`strategies.problem.layer_repeat`); None captures every layer."""
    baseline: str | None = None
    """Plan a hand-written layout instead (``ddp``, ``fsdp``, ``hsdp``, ``megatron``, ``fsdp_tp``): its
    parameter and batch placements are pinned and the solver chooses the rest
    (:mod:`strategies.plan.baselines`)."""
    recompute: str = AUTO
    """Activation recomputation (:mod:`strategies.problem.recompute`): ``auto`` (the program chooses what to
    keep for the backward and what to make again), ``none``, ``selective`` (keep the outputs of matrix
    products and attention, recompute the rest), ``full`` (keep each layer's input only)."""
    graph: dict[str, Any] | None = None
    """A graph document a launcher exported (``docs/graph-format.md``), planned instead of a model: no model
    code is imported or run. ``model`` is then ``""`` and the shape fields (``batch``, ``seq``, ``layers``,
    ``options``) are unset: the graph fixes them."""
    microbatches: int | None = None
    """A pipeline (a ``pp`` axis first, :mod:`strategies.plan.pipeline_plan`): micro-batches per step; None
    chooses among ``p``, ``2p``, ``4p``."""
    schedule: str | None = None
    """A pipeline's schedule, ``1f1b``, ``interleaved-1f1b`` or ``gpipe``; None chooses."""
    parameter_memory_share: float = 1.0
    """The share of parameter, gradient and optimizer-state memory the program counts: a pipeline's
    micro-batch plan counts a stage's ``1/p`` (:mod:`strategies.plan.pipeline_plan`)."""
    cutoff_s: float | None = None
    """A search's pruning: a plan costing more than this (the program's step seconds) is of no use to the
    caller; once the solve's bound proves none costs less, planning stops with :class:`PrunedError`."""
    exact_min_peak: bool = True
    """Where no plan fits, name the smallest peak any plan reaches (a HiGHS program of up to 10 s: 4 GB and
    more on llama3-405b's 2,048-wide meshes, whose search workers the kernel killed for memory), or only
    each node's least usage summed, a lower bound ("at least"; a search's candidates and a pipeline's
    micro-batch plans ask for no more)."""


@dataclass
class PlanOutcome:
    plan: dict[str, Any]
    built: BuiltProblem
    result: SolveResult
    timings: dict[str, float]


def request_record(request: PlanRequest) -> dict[str, Any]:
    """The request as the plan keeps it: a graph document by its label, size and digest, not whole."""
    record = asdict(request)
    if request.graph is not None:
        from strategies.graph.export import graph_digest

        graph = request.graph
        record["graph"] = {
            "format": graph.get("format"),
            "version": graph.get("version"),
            "model": graph.get("model", ""),
            "nodes": len(graph.get("nodes", ())),
            "sha256": graph_digest(graph),
        }
    return record


__all__ = [
    "DEFAULT_BATCH",
    "DEFAULT_CAPTURED_LAYERS",
    "DEFAULT_GAP",
    "DEFAULT_SEQ",
    "PIPELINE_AXIS",
    "PlanOutcome",
    "PlanRequest",
    "request_record",
]
