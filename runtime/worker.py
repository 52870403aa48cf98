"""One rank of `autoshard run`: build the model, apply the plan, train, check against one process, report.

Every rank builds the same model from the same seed (a built-in model with its own init on the CPU, or a
user's factory with its own weights and inputs), captures its training step exactly as the planner did,
and runs it with :class:`~runtime.planned_step.PlannedStep`. With ``check`` each rank also runs the same
steps on one process (the eager module, ``loss.backward()``, the same optimizer) and compares the loss and
every gradient of step 0, then every parameter after the last step, within a tolerance fit for the dtype.
DTensor's ``CommDebugMode`` counts the collectives of each step; the report puts them beside the plan's.
Step ``k`` draws its random numbers (dropout) from ``torch.manual_seed(seed + k)``, the planned step and the
one-process reference alike, so their masks are the same (:mod:`runtime.random_ops`).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import json
import math
import statistics
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from runtime import checkpoint, random_ops
from runtime.apply import apply_plan, compute_dtype_of
from runtime.collectives import COLLECTIVE_NAMES, CountCollectives
from runtime.plan_checks import PlanMismatch, check_plan
from runtime.planned_step import LiveBytes

#: (rtol, atol) of a sharded result against one process, by dtype: sums in another order round apart.
TOLERANCE = {
    torch.float64: (1e-9, 1e-12),
    torch.float32: (1e-4, 1e-5),
    torch.bfloat16: (4e-2, 4e-2),
    torch.float16: (1e-2, 1e-3),
}


class CheckFailed(RuntimeError):
    """The planned run differs from one process; the message names the first tensor that does."""


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


def make_optimizer(name: str, parameters: Iterable[torch.nn.Parameter], lr: float) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(parameters, lr=lr)
    if name == "adamw":
        return torch.optim.AdamW(parameters, lr=lr)
    raise ValueError(f"--optimizer: unknown optimizer {name!r}; choose sgd or adamw")


def run_rank(options: RunOptions) -> dict[str, Any]:
    """Everything one rank does (the process group is up); the report (the same on every rank)."""
    from torch.distributed.tensor.debug import CommDebugMode

    from strategies.graph.capture import input_tensors

    plan = load_plan(options.plan)
    check_plan(plan)
    check_world(plan, dist.get_world_size())
    mesh = device_mesh(options.device, tuple(plan["mesh"]["shape"]), tuple(plan["mesh"]["axis_names"]))
    spec, applied, reference = _build_and_apply(options, plan, mesh)
    drawn = random_ops.random_ops(applied.step.graph.order)
    if reference is not None:
        reference.random_ops = drawn
    inputs = input_tensors(spec.example_inputs)
    parameters = applied.parameters
    optimizer = make_optimizer(options.optimizer, parameters.values(), options.lr)
    if reference is not None:
        reference.optimizer = make_optimizer(options.optimizer, reference.module.parameters(), options.lr)
    if options.load:
        checkpoint.load(spec.module, optimizer, options.load)
        if reference is not None:
            reference.take(parameters, optimizer)
    losses: list[float] = []
    seconds: list[float] = []
    measured: dict[str, int] = {}
    measured_bytes = 0
    deviations: list[dict[str, Any]] = []
    peak = 0
    for index in range(options.steps):
        optimizer.zero_grad(set_to_none=True)
        held = _state_bytes(optimizer)
        random_ops.seed_step(options.seed, index)  # dropout's masks: the same draws on every rank
        started = time.perf_counter()
        with CommDebugMode() as comm, CountCollectives() as sizes:
            result = applied.forward_backward(inputs)
        optimizer.step()
        seconds.append(time.perf_counter() - started)
        peak = max(peak, result.peak_bytes + held, _step_bytes(parameters, optimizer))
        if index == 0:
            measured, measured_bytes = _collective_counts(comm), sum(sizes.nbytes.values())
            deviations = [dataclasses.asdict(d) for d in result.deviations]
        losses.append(float(result.loss.full_tensor()))
        if dist.get_rank() == 0:  # progress, as it goes
            print(f"step {index}: loss {losses[-1]:.6g} ({seconds[-1]:.3f} s)", file=sys.stderr, flush=True)
        if reference is not None:
            random_ops.seed_step(options.seed, index)  # the draws the planned step made
            reference.step(result if index == 0 else None)
    if options.save:
        checkpoint.save(spec.module, optimizer, options.save)
    if reference is not None:
        reference.compare_parameters(parameters, options)
    predicted = plan.get("predicted", {}).get("collectives", {})
    expected = expected_collectives(predicted, options.backend)
    return {
        "model": options.model,
        "mesh": plan["mesh"],
        "world_size": dist.get_world_size(),
        "backend": options.backend,
        "steps": options.steps,
        "optimizer": options.optimizer,
        "loss": losses,
        "step_time_s": statistics.median(seconds[1:] or seconds),
        "step_times_s": seconds,
        "collectives": {
            "measured": measured,
            "predicted": predicted,
            "expected_on_backend": expected,
            "match": measured == expected,
            "measured_bytes": measured_bytes,
            "predicted_bytes": plan.get("predicted", {}).get("comm_bytes"),
        },
        "deviations": deviations,
        "random_ops": {"ops": drawn, "path": random_ops.PATH if drawn else None},
        "recompute": {  # what the plan recomputes, and the ops made again for it
            "values": len(applied.step.recomputed),
            "ops_made_again": sum(entry.again for entry in applied.step.entries),
        },
        "memory": _memory(peak, plan),
        "checked": options.check,
    }


def _state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """This rank's bytes of optimizer state (Adam's moments; nothing for plain SGD)."""
    live = LiveBytes()
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                live.add(value)
    return live.now


def _step_bytes(parameters: dict[str, torch.nn.Parameter], optimizer: torch.optim.Optimizer) -> int:
    """Bytes held at the optimizer step: parameters, gradients and optimizer state."""
    live = LiveBytes()
    for parameter in parameters.values():
        live.add(parameter)
        if parameter.grad is not None:
            live.add(parameter.grad)
    return live.now + _state_bytes(optimizer)


def _memory(peak: int, plan: dict[str, Any]) -> dict[str, Any]:
    """Every rank's measured peak beside the plan's predicted peak per device."""
    peaks: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(peaks, peak)
    predicted = plan.get("predicted", {}).get("peak_memory_bytes")
    return {
        "peak_bytes_per_rank": peaks,
        "predicted_peak_bytes": predicted,
        "largest_over_predicted": max(peaks) / predicted if predicted else None,
    }


def _collective_counts(comm: Any) -> dict[str, int]:
    """CommDebugMode's counts under the names plans use."""
    counts: dict[str, int] = {}
    for op, count in comm.get_comm_counts().items():
        name = next((part for part in str(op).split(".") if part in COLLECTIVE_NAMES), str(op))
        key = COLLECTIVE_NAMES.get(name, name)
        counts[key] = counts.get(key, 0) + int(count)
    return counts


@functools.cache
def device_mesh(device: str, shape: tuple[int, ...], axis_names: tuple[str, ...] | None = None) -> Any:
    """The device mesh of this layout (its axes unnamed without ``axis_names``), made once per process: each
    axis is a process group that is never freed (DTensor's caches keep meshes by value, so destroying one
    breaks the next run), and a process that runs plan after plan would otherwise gather idle groups and
    their threads."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device, shape, mesh_dim_names=axis_names)


def check_world(plan: dict[str, Any], world: int) -> None:
    """Refuse a run whose number of ranks is not the plan's mesh size."""
    shape = plan["mesh"]["shape"]
    if math.prod(shape) != world:
        raise PlanMismatch(
            f"world size: the plan's mesh {list(shape)} needs {math.prod(shape)} ranks, this run has {world}"
        )


def _build_and_apply(
    options: RunOptions, plan: dict[str, Any], mesh: Any
) -> tuple[Any, Any, Reference | None]:
    """The model built from the seed with the plan's shapes (every rank alike), its one-process twin when
    checking, and the plan applied to it."""
    from strategies.plan.planner import PlanRequest, build_request_model, capture_request

    request = PlanRequest(**plan["request"])
    torch.manual_seed(options.seed)
    try:  # only building the model can say the plan was made for another: reading the plan says its own
        spec = build_request_model(request, options.model, request.layers, options.device)
        short = None
        if "layers" in plan:  # planned from a short capture: the same capture, to map every layer onto it
            short, _ = capture_request(request, int(plan["layers"]["captured"]))
    except PlanMismatch:
        raise
    except ValueError as error:  # the plan's shapes and options do not build this model
        raise model_mismatch(request.model, options.model, error) from error
    computing = compute_dtype_of(plan)
    reference = Reference(copy.deepcopy(spec.module), spec, computing) if options.check else None
    applied = apply_plan(spec.module, plan, mesh, spec.example_inputs, spec.loss_fn, short_graph=short)
    return spec, applied, reference


def model_mismatch(planned: str, named: str, error: ValueError) -> PlanMismatch:
    """The refusal of a model the plan was not made for."""
    return PlanMismatch(f"model: the plan was made for {planned}, it does not build {named}: {error}")


@dataclass
class Reference:
    """The same training on one process: the eager module, ``loss.backward()``, the same optimizer."""

    module: torch.nn.Module
    spec: Any
    compute_dtype: torch.dtype | None = None
    """Mixed precision: the step computes on copies of the parameters (and floating inputs) in this dtype."""
    optimizer: torch.optim.Optimizer | None = None
    random_ops: dict[str, int] = dataclasses.field(default_factory=dict)
    """The step's random ops by op (:func:`runtime.random_ops.random_ops`), named when a check fails."""

    def step(self, planned: Any = None) -> None:
        """One step; with ``planned`` (the planned step's result) compare its loss and every gradient."""
        from strategies.graph.capture import call_module, default_loss

        assert self.optimizer is not None
        self.optimizer.zero_grad(set_to_none=True)
        output = call_module(self.module, self.spec.example_inputs, self.compute_dtype)
        loss = (self.spec.loss_fn or default_loss)(output)
        loss.backward()
        if planned is not None:
            computed = self.compute_dtype  # a sum in bf16 rounds apart as bf16 does, whatever it is kept in
            with self._naming_randomness():
                _compare("loss", planned.loss.full_tensor(), loss.detach(), dtype=computed)
                for name, gradient in planned.gradients.items():
                    held = self.module.get_parameter(name)
                    expected = torch.zeros_like(held) if held.grad is None else held.grad
                    _compare(f"{name}.grad", gradient.full_tensor(), expected, dtype=computed)
        self.optimizer.step()

    @contextlib.contextmanager
    def _naming_randomness(self) -> Iterator[None]:
        """A check that fails on a step with random ops says so: the draws are the first suspect."""
        try:
            yield
        except CheckFailed as error:
            if not self.random_ops:
                raise
            ops = ", ".join(f"{count} {op}" for op, count in self.random_ops.items())
            raise CheckFailed(
                f"{error}; the step draws random numbers ({ops}), which the planned step draws as one process"
                " does: does the model draw outside its traced ops? Check with dropout off for the rest"
            ) from error

    def take(self, parameters: dict[str, torch.nn.Parameter], optimizer: torch.optim.Optimizer) -> None:
        """Start from the weights and optimizer state a checkpoint just gave the ranks."""
        from torch.distributed.tensor import DTensor
        from torch.utils._pytree import tree_map

        assert self.optimizer is not None
        with torch.no_grad():
            for name, parameter in self.module.named_parameters():
                parameter.copy_(parameters[name].full_tensor())
        whole = tree_map(lambda t: t.full_tensor() if isinstance(t, DTensor) else t, optimizer.state_dict())
        self.optimizer.load_state_dict(whole)

    def compare_parameters(self, parameters: dict[str, torch.nn.Parameter], options: RunOptions) -> None:
        """Every parameter after the last step. Adam divides by the gradient's running scale, so a gradient
        that is rounding noise (a key bias: softmax ignores it) still moves its weight by up to lr a step,
        differently on each layout: the tolerance grows by that much."""
        drift = 2 * options.lr * options.steps if options.optimizer == "adamw" else 0.0
        held = dict(self.module.named_parameters())
        with self._naming_randomness():
            for name, parameter in parameters.items():
                what = f"{name} after {options.steps} steps"
                _compare(what, parameter.full_tensor(), held[name].detach(), drift, dtype=self.compute_dtype)


def load_plan(path: str) -> dict[str, Any]:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError as error:
        raise PlanMismatch(f"plan: no plan file {path}") from error
    except json.JSONDecodeError as error:
        raise PlanMismatch(f"plan: {path} is not JSON ({error})") from error


def expected_collectives(predicted: dict[str, int], backend: str) -> dict[str, int]:
    """The collectives DTensor runs for the plan's on ``backend``: gloo has no all-to-all, and DTensor
    moves a shard between dims there by an all-gather."""
    expected = {name: count for name, count in predicted.items() if count}
    if backend == "gloo" and "all_to_all" in expected:
        expected["all_gather"] = expected.get("all_gather", 0) + expected.pop("all_to_all")
    return expected


def _compare(
    what: str,
    actual: torch.Tensor,
    expected: torch.Tensor,
    extra_atol: float = 0.0,
    dtype: torch.dtype | None = None,
) -> None:
    """Refuse ``actual`` unless it is ``expected`` within the tolerance of ``dtype`` (the dtype the values
    were computed in; default ``expected``'s)."""
    rtol, atol = TOLERANCE.get(dtype or expected.dtype, (1e-4, 1e-5))
    atol += extra_atol
    if actual.shape != expected.shape:
        raise CheckFailed(
            f"{what}: shape {tuple(actual.shape)} differs from one process's {tuple(expected.shape)}"
        )
    difference = (actual.double() - expected.double()).abs()
    allowed = atol + rtol * expected.double().abs().max()
    if not bool((difference <= allowed).all()):
        raise CheckFailed(
            f"{what} differs from one process: largest difference {float(difference.max()):.3g} "
            f"(allowed {float(allowed):.3g} for {dtype or expected.dtype})"
        )
