"""Request and response bodies of the REST API (pydantic); unknown fields are refused by name."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Backend = Literal["auto", "cbc", "highs", "cpsat", "heuristic"]
JobState = Literal["queued", "running", "succeeded", "failed", "canceled"]
Placement = list[str]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MeshSpec(Strict):
    shape: list[int] = Field(min_length=1, max_length=4, description="devices per mesh axis, e.g. [2, 4]")
    axis_names: list[str] | None = Field(None, max_length=4, description="e.g. ['dp', 'tp']")


class SolverOptions(Strict):
    backend: Backend = "auto"
    time_limit_s: float = Field(30.0, gt=0, description="the solver's time limit, seconds")
    gap: float = Field(0.01, ge=0, le=1, description="stop once proven within this share of the optimum")


class PinnedPlacements(Strict):
    inputs: dict[int, Placement] = Field(default_factory=dict, description="input index -> placement")
    parameters: dict[str, Placement] = Field(default_factory=dict, description="parameter name -> placement")


class PlanSubmission(Strict):
    """What to plan: a built-in model (with configuration overrides) or a launcher's graph, on a mesh."""

    model: str | None = Field(None, max_length=64, description="a built-in model, see GET /v1/models")
    options: dict[str, int | float | bool | str] = Field(
        default_factory=dict, max_length=64, description="the model's configuration overrides"
    )
    graph: dict[str, Any] | None = Field(None, description="a launcher's exported graph (instead of model)")
    mesh: MeshSpec
    hardware: str | dict[str, Any] = Field(
        "h100", description="a preset (GET /v1/hardware) or figures overriding one ({'base': 'h100', ...})"
    )
    memory_gib: float | None = Field(None, gt=0, description="per-device memory budget, GiB")
    batch: int | None = Field(None, ge=1, le=2**31, description="global batch")
    seq: int | None = Field(None, ge=1, le=2**31, description="sequence length")
    layers: int | None = Field(None, ge=1, le=1024, description="the model's depth")
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    pinned: PinnedPlacements = Field(default_factory=PinnedPlacements)
    solver: SolverOptions = Field(default_factory=SolverOptions)
    overlap: float = Field(0.0, ge=0, le=1, description="share of gathers / reductions hidden by compute")
    captured_layers: int | None = Field(4, ge=0, le=1024, description="layers captured for deep models")
    baseline: Literal["ddp", "fsdp", "megatron", "fsdp_tp"] | None = None


class Progress(BaseModel):
    phase: str | None = None
    incumbent: float | None = None
    bound: float | None = None
    gap: float | None = None
    elapsed_s: float | None = None


class JobError(BaseModel):
    type: str
    message: str


class JobOut(BaseModel):
    id: str
    kind: Literal["plan", "solve", "search"]
    state: JobState
    problem_hash: str
    created_at: float
    started_at: float | None
    finished_at: float | None
    attempts: int
    progress: Progress | None
    error: JobError | None
    plan_url: str | None = Field(description="where the result is, once the job succeeded")


class JobPage(BaseModel):
    items: list[JobOut]
    total: int
    limit: int
    offset: int


class SearchSubmission(Strict):
    """A plan search: every mesh of ``devices`` (1 to ``max_mesh_dims`` axes) times ``batch_sizes``, each
    planned with ``solver`` (its time limit is per candidate)."""

    model: str = Field(max_length=64, description="a built-in model, see GET /v1/models")
    options: dict[str, int | float | bool | str] = Field(
        default_factory=dict, max_length=64, description="the model's configuration overrides"
    )
    devices: int = Field(ge=1, le=4096, description="devices to lay the model over")
    hardware: str = Field("h100", max_length=64, description="a preset, see GET /v1/hardware")
    memory_gib: float | None = Field(None, gt=0, description="per-device memory budget, GiB")
    batch_sizes: list[Annotated[int, Field(ge=1, le=2**31)]] = Field(
        [8], min_length=1, max_length=16, description="global batches to try"
    )
    seq: int | None = Field(None, ge=1, le=2**31, description="sequence length")
    layers: int | None = Field(None, ge=1, le=1024, description="the model's depth")
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    max_mesh_dims: int = Field(3, ge=1, le=3, description="mesh axes at most")
    solver: SolverOptions = Field(default_factory=SolverOptions)
    overlap: float = Field(0.0, ge=0, lt=1, description="share of gathers / reductions hidden by compute")
    captured_layers: int | None = Field(4, ge=0, le=1024, description="layers captured for deep models")


class SearchProgress(BaseModel):
    done: int = 0
    total: int = 0
    planned: int = 0
    infeasible: int = 0
    failed: int = 0
    best: dict[str, Any] | None = Field(None, description="the fastest candidate so far")
    elapsed_s: float | None = None


class SearchOut(BaseModel):
    id: str
    state: JobState
    created_at: float
    started_at: float | None
    finished_at: float | None
    progress: SearchProgress | None
    error: JobError | None
    results: dict[str, Any] | None = Field(description="results.json, once the search succeeded")
    report_url: str


class ModelInfo(BaseModel):
    name: str
    options: dict[str, Any]
    layers: int | None


class ErrorBody(BaseModel):
    detail: str
    field: str | None = None
