"""What a search is asked: the model and its configuration, the devices, the options it sweeps."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from service.search.candidates import DEFAULT_MESH_DIMS, Candidate, check_axis_limits
from strategies.plan.planner import DEFAULT_GAP, PlanRequest
from strategies.problem.recompute import check_policy

EXECUTORS = ("local", "ray")
BUDGET_SOLVE_SHARE = 0.8
"""The share of a budget's worker-seconds given to the candidates' solvers; the rest is each candidate's
problem build and the captures (llama3-8b on 64 devices, 48 candidates, 2 workers: 60 s -> 2 s each, 57 s
wall)."""
MIN_CANDIDATE_LIMIT_S = 0.5
"""No candidate's solver gets less, whatever the budget: below, plans of 3-D meshes are little better than
the heuristic's first answer."""


@dataclass
class SearchRequest:
    """A search: every mesh of ``devices`` (1 to ``max_mesh_dims`` axes) times ``batch_sizes``."""

    model: str
    """A built-in model name or ``path/file.py:factory``."""
    devices: int
    hardware: str = "h100"
    memory_gib: float | None = None
    """Per-device memory budget in GiB; ``None``: the hardware's capacity."""
    batch_sizes: list[int] = field(default_factory=lambda: [8])
    seq: int | None = None
    """Sequence length of a language model (``None``: the planner's default); ignored by models without."""
    max_mesh_dims: int = DEFAULT_MESH_DIMS
    """Mesh axes at most; 4 adds pipelines (``pp, dp, cp, tp`` and ``pp, dp, tp``)."""
    axis_limits: dict[str, int] = field(default_factory=dict)
    """The largest size of an axis by role (``{"tp": 8}``); meshes with a larger one are not tried."""
    executor: str = "local"
    """``local`` (a process pool) or ``ray``."""
    workers: int = field(default_factory=lambda: os.cpu_count() or 1)
    """Candidates planned at once (the local pool's processes)."""
    time_limit_s: float = 60.0
    """The solver's time limit per candidate: a candidate stopped by it keeps its best plan, status
    ``feasible`` with its gap."""
    budget_s: float | None = None
    """The whole search's wall time, shared by its candidates (``None``: no budget): each candidate's solver
    gets `BUDGET_SOLVE_SHARE` of ``budget_s x workers / candidates`` where that is below ``time_limit_s``
    (:meth:`within_budget`), at least `MIN_CANDIDATE_LIMIT_S`."""
    gap: float = DEFAULT_GAP
    backend: str = "auto"
    dtype: str = "bfloat16"
    """The parameters' dtype."""
    compute_dtype: str | None = None
    """Mixed precision: every candidate computes on copies of the parameters in this dtype."""
    layers: int | None = None
    options: dict[str, Any] = field(default_factory=dict)
    captured_layers: int | None = 4
    recompute: str = "auto"
    """Activation recomputation for every candidate (:mod:`strategies.problem.recompute`)."""
    prune: bool = True
    """Stop a candidate once its solve proves it cannot beat the best so far (:mod:`service.search.pruning`);
    False plans every candidate to the end (each row then has its own plan and figures)."""

    def __post_init__(self) -> None:
        if self.devices < 1:
            raise ValueError(f"devices: at least 1, got {self.devices}")
        if self.executor not in EXECUTORS:
            raise ValueError(f"executor: {self.executor!r}; choose {' or '.join(EXECUTORS)}")
        if self.workers < 1:
            raise ValueError(f"workers: at least 1, got {self.workers}")
        if self.time_limit_s <= 0:
            raise ValueError(f"time_limit_s: must be positive, got {self.time_limit_s}")
        if self.budget_s is not None and self.budget_s <= 0:
            raise ValueError(f"budget_s: must be positive, got {self.budget_s}")
        check_policy(self.recompute)
        check_axis_limits(self.axis_limits)
        if self.compute_dtype is not None:
            from strategies.tensor_meta import parse_compute_dtype

            parse_compute_dtype(self.compute_dtype)

    def record(self) -> dict[str, Any]:
        return asdict(self)

    def within_budget(self, candidates: int) -> SearchRequest:
        """This search with each of its ``candidates``' solver limit cut to its share of the budget (itself
        when it has none, or its limit is within the share): what the candidates are planned, cached and
        recorded with."""
        if self.budget_s is None or candidates < 1:
            return self
        share = BUDGET_SOLVE_SHARE * self.budget_s * self.workers / candidates
        limit = max(MIN_CANDIDATE_LIMIT_S, round(share, 2))
        return self if limit >= self.time_limit_s else dataclasses.replace(self, time_limit_s=limit)

    def plan_request(self, candidate: Candidate) -> PlanRequest:
        """The request planning ``candidate`` alone: what :func:`~strategies.plan.planner.plan_model` is
        given for it (the search plans it from the shared capture, with the same result)."""
        return PlanRequest(
            model=self.model,
            mesh=candidate.mesh_text,
            axis_names=",".join(candidate.axis_names),
            hardware=self.hardware,
            memory_gib=self.memory_gib,
            batch=candidate.batch,
            seq=self.seq,
            layers=self.layers,
            dtype=self.dtype,
            compute_dtype=self.compute_dtype,
            backend=self.backend,
            time_limit=self.time_limit_s,
            gap=self.gap,
            options=dict(self.options),
            captured_layers=self.captured_layers,
            recompute=self.recompute,
            exact_min_peak=False,  # an infeasible row's smallest peak is a bound: not worth a HiGHS program
        )

    def service_submission(self, candidate: Candidate) -> dict[str, Any]:
        """The body of the equivalent ``POST /v1/plans``: its canonical form keys the service's plan cache."""
        return {
            "model": self.model,
            "options": dict(self.options),
            "mesh": {"shape": list(candidate.mesh), "axis_names": list(candidate.axis_names)},
            "hardware": self.hardware,
            "memory_gib": self.memory_gib,
            "batch": candidate.batch,
            "seq": self.seq,
            "layers": self.layers,
            "dtype": self.dtype,
            "compute_dtype": self.compute_dtype,
            "solver": {"backend": self.backend, "time_limit_s": self.time_limit_s, "gap": self.gap},
            "captured_layers": self.captured_layers,
            "recompute": self.recompute,
        }
