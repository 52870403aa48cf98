"""What a run of `autoshard run` is given and builds: its options, its plan, its model.

Every rank, and the one-process run a check compares with, builds the model the same way from the same seed
(:func:`build_run_model`): a built-in model with its own initialisation, or a user's factory with its own
weights and inputs; with ``meta_init`` or ``weights`` its parameters on the meta device, for each rank to make
only its own shards.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from runtime.parameter_shards import meta_parameters
from runtime.plan_checks import PlanMismatch
from strategies.graph.capture import JointGraph
from strategies.models import ModelSpec


@dataclass
class RunOptions:
    """What `autoshard run` does on every rank."""

    model: str
    """The model the plan was made for (built-in name or ``path/file.py:factory``)."""
    plan: str
    """Path of the plan JSON."""
    steps: int = 1
    optimizer: str = "sgd"
    """``sgd`` or ``adamw``."""
    lr: float = 1e-2
    check: bool = False
    report: str | None = None
    """Rank 0 writes the report JSON here."""
    save: str | None = None
    """Write a sharded checkpoint (parameters, optimizer state) to this directory after the last step."""
    load: str | None = None
    """Start from the sharded checkpoint in this directory (written under any plan)."""
    seed: int = 0
    device: str = "cpu"
    backend: str = "gloo"
    meta_init: bool = False
    """Build the model on the meta device: each rank makes only its own shards, by the model's own
    initialisation from the seed (:mod:`runtime.parameter_shards`); the whole equals the model built on one
    process from the same seed."""
    weights: str | None = None
    """Each rank reads its own shards from these weights (a DCP directory or safetensors files); the model is
    built on the meta device."""

    @property
    def sharded_build(self) -> bool:
        """No rank ever holds the whole model (the one-process check then runs in a process of its own)."""
        return self.meta_init or self.weights is not None


def make_optimizer(name: str, parameters: Iterable[torch.nn.Parameter], lr: float) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(parameters, lr=lr)
    if name == "adamw":
        return torch.optim.AdamW(parameters, lr=lr)
    raise ValueError(f"--optimizer: unknown optimizer {name!r}; choose sgd or adamw")


def load_plan(path: str) -> dict[str, Any]:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError as error:
        raise PlanMismatch(f"plan: no plan file {path}") from error
    except json.JSONDecodeError as error:
        raise PlanMismatch(f"plan: {path} is not JSON ({error})") from error


def check_world(plan: dict[str, Any], world: int) -> None:
    """Refuse a run whose number of ranks is not the plan's mesh size."""
    shape = plan["mesh"]["shape"]
    if math.prod(shape) != world:
        raise PlanMismatch(
            f"world size: the plan's mesh {list(shape)} needs {math.prod(shape)} ranks, this run has {world}"
        )


def build_run_model(
    options: RunOptions, plan: dict[str, Any], whole: bool = False
) -> tuple[ModelSpec, JointGraph | None]:
    """The model the plan was made for, built from the seed with the plan's shapes (on every rank alike;
    ``whole``: on the CPU, all of it, for the one-process run), and the short capture a plan of one needs to
    map every layer onto it (else None).

    A built-in model draws its example inputs before its parameters, so a sharded build (parameters on the
    meta device, drawn when the plan is applied) leaves the random state where the whole build starts
    drawing its parameters: each rank's shards are then the whole build's. A factory that draws after its
    model does not have this; ``--check`` says so."""
    from strategies.plan.planner import PlanRequest, build_request_model, capture_request

    request = PlanRequest(**plan["request"])
    torch.manual_seed(options.seed)
    sharded = options.sharded_build and not whole
    try:  # only building the model can say the plan was made for another: reading the plan says its own
        with meta_parameters() if sharded else contextlib.nullcontext():
            spec = build_request_model(
                request, options.model, request.layers, "cpu" if whole else options.device
            )
        short = None
        if "layers" in plan:  # planned from a short capture: the same capture, to map every layer onto it
            pipeline = plan.get("pipeline")
            captured = (
                dataclasses.replace(request, batch=pipeline["microbatch_size"]) if pipeline else request
            )
            short, _ = capture_request(captured, int(plan["layers"]["captured"]))
    except PlanMismatch:
        raise
    except ValueError as error:  # the plan's shapes and options do not build this model
        raise model_mismatch(request.model, options.model, error) from error
    return spec, short


def model_mismatch(planned: str, named: str, error: ValueError) -> PlanMismatch:
    """The refusal of a model the plan was not made for."""
    return PlanMismatch(f"model: the plan was made for {planned}, it does not build {named}: {error}")
