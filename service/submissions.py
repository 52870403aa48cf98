"""What the service is asked, below its web layer: the submissions (a plan, a search) as validated models,
the error that refuses one (:class:`BadRequest`), and the one translation of each into what the planner and
the search run (:func:`plan_request` -> ``PlanRequest``, :func:`search_request` -> ``SearchRequest``).

The routes, the intake, the planning, the job workers and the search import it; of the service it imports
only the search's request type (when translating). The CLI builds ``PlanRequest`` and ``SearchRequest`` from
its own options instead (hardware files, mesh text, pipeline and executor options no submission takes).
Requests are strict: unknown fields are refused by name, numbers must be finite and every field is bounded
(lengths, counts, ranges); free-form documents (a launcher's graph) are bounded by
:func:`service.intake.check_free_form`. Hardware is a preset name or an object of figures, never a path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    StringConstraints,
    Tag,
    field_serializer,
)
from pydantic_core import PydanticCustomError

from strategies.cost.hardware import PRESETS

if TYPE_CHECKING:
    from service.search.request import SearchRequest
    from strategies.plan.planner import PlanRequest

Backend = Literal["auto", "cbc", "highs", "cpsat", "heuristic"]


class BadRequest(ValueError):
    """A request the service refuses (``status``: 422, or 413 for a graph past the service's bounds);
    ``field`` names the offending field of the body."""

    def __init__(self, field: str, message: str, status: int = 422) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message
        self.status = status


def _a_preset(value: Any) -> Any:
    """Refuse any other string with one message whatever it names (a path that exists on the server and
    one that does not are answered alike: nothing is read)."""
    if isinstance(value, str) and value not in PRESETS:
        raise PydanticCustomError(
            "preset",
            "not a preset; presets are {presets} (or an object of figures over one): "
            "the service reads no file",
            {"presets": ", ".join(sorted(PRESETS))},
        )
    return value


PresetName = Annotated[Literal[tuple(sorted(PRESETS))], BeforeValidator(_a_preset)]  # type: ignore[valid-type]
Name = Annotated[str, StringConstraints(min_length=1, max_length=256)]
PlacementText = Annotated[str, StringConstraints(min_length=1, max_length=16)]
Placement = Annotated[list[PlacementText], Field(min_length=1, max_length=4)]
OptionName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")]
OptionValue = (
    Annotated[int, Field(ge=-(2**63), le=2**63 - 1)] | float | bool | Annotated[str, Field(max_length=256)]
)
AxisName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,15}$")]
MAX_TIME_LIMIT_S = 7 * 86400.0
"""A bound on any time limit the schema takes (the service's own cap, ``max_time_limit_s``, is lower)."""
MAX_MEMORY_GIB = 2.0**20
BANDWIDTH = Field(None, gt=0, le=1e16, description="bytes/s")
SECONDS = Field(None, gt=0, le=1.0, description="seconds")
SHARE = Field(None, gt=0, le=1.0, description="a share of a peak rate")
LENGTH = Field(None, ge=0, le=2**31, description="elements")
WHOLE = Field(None, ge=1, le=2**31, description="a whole number")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class MeshSpec(Strict):
    shape: list[Annotated[int, Field(ge=1, le=2**20)]] = Field(
        min_length=1, max_length=4, description="devices per mesh axis, e.g. [2, 4]"
    )
    axis_names: list[AxisName] | None = Field(None, max_length=4, description="e.g. ['dp', 'tp']")


class SolverOptions(Strict):
    backend: Backend = "auto"
    time_limit_s: float = Field(
        30.0, gt=0, le=MAX_TIME_LIMIT_S, description="the solver's time limit, seconds"
    )
    gap: float = Field(0.01, ge=0, le=1, description="stop once proven within this share of the optimum")


class PinnedPlacements(Strict):
    inputs: dict[Annotated[int, Field(ge=0, le=255)], Placement] = Field(
        default_factory=dict, max_length=256, description="input index -> placement"
    )
    parameters: dict[Name, Placement] = Field(
        default_factory=dict, max_length=4096, description="parameter name -> placement"
    )


class LinkFigures(Strict):
    bandwidth: float | None = BANDWIDTH
    latency: float | None = SECONDS


class HardwareFigures(Strict):
    """A preset (``base``) with some of its figures replaced (GET /v1/hardware lists every figure)."""

    base: PresetName = "h100"
    name: str | None = Field(None, min_length=1, max_length=64)
    peak_flops: (
        dict[
            Annotated[str, StringConstraints(min_length=1, max_length=32)],
            Annotated[float, Field(gt=0, le=1e19)],
        ]
        | None
    ) = Field(None, max_length=32, description="dtype -> dense FLOP/s")
    memory_bandwidth: float | None = BANDWIDTH
    memory_bytes: int | None = Field(None, ge=1, le=2**53, description="device memory, bytes")
    node_size: int | None = Field(None, ge=1, le=2**20, description="devices per node")
    intra_node: LinkFigures | None = None
    inter_node: LinkFigures | None = None
    launch_s: float | None = SECONDS
    collective_launch_s: float | None = SECONDS
    host_to_device: float | None = BANDWIDTH
    default_flops_dtype: str | None = Field(None, min_length=1, max_length=32)
    sm_count: int | None = Field(None, ge=1, le=2**20, description="multiprocessors: GEMM tiles per wave")
    matmul_efficiency: float | None = SHARE
    matmul_tile_m: int | None = WHOLE
    matmul_tile_n: int | None = WHOLE
    matmul_k_half: float | None = LENGTH
    attention_efficiency: float | None = SHARE
    attention_backward_efficiency: float | None = SHARE
    attention_seq_half: float | None = LENGTH
    attention_head_dim: int | None = WHOLE
    memory_efficiency: float | None = SHARE
    sustained_efficiency: float | None = SHARE
    overlap_slowdown: float | None = Field(None, ge=0, le=1, description="compute lost per hidden second")


Hardware = Annotated[
    Annotated[PresetName, Tag("preset")] | Annotated[HardwareFigures, Tag("figures")],
    Discriminator(lambda value: "preset" if isinstance(value, str) else "figures"),
]
"""A preset's name or an object of figures; errors name the figure, not both forms."""


def hardware_document(hardware: str | HardwareFigures) -> str | dict[str, Any]:
    """A preset name, or the figures given (unset ones left out): the request's canonical hardware."""
    return hardware if isinstance(hardware, str) else hardware.model_dump(mode="json", exclude_none=True)


class PlanSubmission(Strict):
    """What to plan: a built-in model (with configuration overrides) or a launcher's graph, on a mesh."""

    model: str | None = Field(None, max_length=64, description="a built-in model, see GET /v1/models")
    options: dict[OptionName, OptionValue] = Field(
        default_factory=dict, max_length=64, description="the model's configuration overrides"
    )
    graph: dict[str, Any] | None = Field(None, description="a launcher's exported graph (instead of model)")
    mesh: MeshSpec
    hardware: Hardware = Field(
        "h100", description="a preset (GET /v1/hardware) or figures overriding one ({'base': 'h100', ...})"
    )
    memory_gib: float | None = Field(
        None, gt=0, le=MAX_MEMORY_GIB, description="per-device memory budget, GiB"
    )
    batch: int | None = Field(None, ge=1, le=2**31, description="global batch")
    seq: int | None = Field(None, ge=1, le=2**31, description="sequence length")
    layers: int | None = Field(None, ge=1, le=1024, description="the model's depth")
    dtype: Literal["bfloat16", "float16", "float32"] = Field("bfloat16", description="the parameters' dtype")
    compute_dtype: Literal["bfloat16", "float16", "float32"] | None = Field(
        None, description="mixed precision: compute on copies of the parameters in this dtype"
    )
    pinned: PinnedPlacements = Field(default_factory=PinnedPlacements)
    solver: SolverOptions = Field(default_factory=SolverOptions)
    captured_layers: int | None = Field(4, ge=0, le=1024, description="layers captured for deep models")
    baseline: Literal["ddp", "fsdp", "hsdp", "megatron", "fsdp_tp"] | None = None
    recompute: Literal["auto", "none", "selective", "full"] = Field(
        "auto", description="activation recomputation: the program chooses (auto), or a fixed policy"
    )

    @field_serializer("hardware")
    def _hardware(self, hardware: str | HardwareFigures) -> str | dict[str, Any]:
        return hardware_document(hardware)


class SearchSubmission(Strict):
    """A plan search: every mesh of ``devices`` (1 to ``max_mesh_dims`` axes) times ``batch_sizes``, each
    planned with ``solver`` (its time limit is per candidate)."""

    model: str = Field(max_length=64, description="a built-in model, see GET /v1/models")
    options: dict[OptionName, OptionValue] = Field(
        default_factory=dict, max_length=64, description="the model's configuration overrides"
    )
    devices: int = Field(ge=1, le=4096, description="devices to lay the model over")
    hardware: PresetName = Field("h100", description="a preset, see GET /v1/hardware")
    memory_gib: float | None = Field(
        None, gt=0, le=MAX_MEMORY_GIB, description="per-device memory budget, GiB"
    )
    batch_sizes: list[Annotated[int, Field(ge=1, le=2**31)]] = Field(
        [8], min_length=1, max_length=16, description="global batches to try"
    )
    seq: int | None = Field(None, ge=1, le=2**31, description="sequence length")
    layers: int | None = Field(None, ge=1, le=1024, description="the model's depth")
    dtype: Literal["bfloat16", "float16", "float32"] = Field("bfloat16", description="the parameters' dtype")
    compute_dtype: Literal["bfloat16", "float16", "float32"] | None = Field(
        None, description="mixed precision: compute on copies of the parameters in this dtype"
    )
    max_mesh_dims: int = Field(
        3, ge=1, le=4, description="mesh axes at most (4 adds pipelines: pp,dp,cp,tp and pp,dp,tp)"
    )
    axis_limits: dict[Literal["dp", "cp", "tp", "pp"], Annotated[int, Field(ge=1, le=2**20)]] = Field(
        default_factory=dict, description='the largest size of an axis by role, e.g. {"tp": 8}'
    )
    solver: SolverOptions = Field(default_factory=SolverOptions)
    captured_layers: int | None = Field(4, ge=0, le=1024, description="layers captured for deep models")
    recompute: Literal["auto", "none", "selective", "full"] = Field(
        "auto", description="activation recomputation: the program chooses (auto), or a fixed policy"
    )
    prune: bool = Field(
        True, description="stop a candidate once its bound proves it cannot beat the best so far"
    )


# ------------------------------------------------------------------------------------------ translation


def canonical_plan_request(submission: PlanSubmission) -> dict[str, Any]:
    """The submission with every default filled in, as stored with its job (JSON-ready)."""
    return submission.model_dump(mode="json")


def plan_request(request: dict[str, Any], hardware: Any) -> PlanRequest:
    """What the planner is given for a canonical plan submission (:func:`canonical_plan_request`);
    ``hardware``: its ``hardware`` resolved (the service reads no file a request names)."""
    from strategies.plan.planner import PlanRequest

    solver = request["solver"]
    return PlanRequest(
        model=request["model"] or "",
        graph=request.get("graph"),
        mesh="x".join(str(n) for n in request["mesh"]["shape"]),
        axis_names=None if request["mesh"]["axis_names"] is None else ",".join(request["mesh"]["axis_names"]),
        hardware=hardware,
        memory_gib=request["memory_gib"],
        batch=request["batch"],
        seq=request["seq"],
        layers=request["layers"],
        dtype=request["dtype"],
        compute_dtype=request.get("compute_dtype"),
        backend=solver["backend"],
        time_limit=solver["time_limit_s"],
        gap=solver["gap"],
        options=dict(request["options"]),
        input_placements={int(k): v for k, v in request["pinned"]["inputs"].items()},
        parameter_placements=dict(request["pinned"]["parameters"]),
        captured_layers=request["captured_layers"] or None,
        baseline=request["baseline"],
        recompute=request.get("recompute", "auto"),
    )


def search_request(body: dict[str, Any], executor: str = "local", workers: int = 1) -> SearchRequest:
    """The search a canonical search submission asks for, run by ``executor`` with ``workers``; its
    hardware a preset (the service reads no file a request names)."""
    from service.search.request import SearchRequest

    if body["hardware"] not in PRESETS:
        raise BadRequest("hardware", "not a preset")
    solver = body["solver"]
    return SearchRequest(
        model=body["model"],
        devices=body["devices"],
        hardware=body["hardware"],
        memory_gib=body["memory_gib"],
        batch_sizes=list(body["batch_sizes"]),
        seq=body["seq"],
        max_mesh_dims=body["max_mesh_dims"],
        axis_limits=dict(body.get("axis_limits") or {}),
        executor=executor,
        workers=workers,
        time_limit_s=solver["time_limit_s"],
        gap=solver["gap"],
        backend=solver["backend"],
        dtype=body["dtype"],
        compute_dtype=body.get("compute_dtype"),
        layers=body["layers"],
        options=dict(body["options"]),
        captured_layers=body["captured_layers"] or None,
        recompute=body.get("recompute", "auto"),
        prune=body.get("prune", True),
    )
