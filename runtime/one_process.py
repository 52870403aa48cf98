"""The one-process run a check compares a planned run with, and how the two are compared.

:class:`Reference` trains the eager module beside each rank (``loss.backward()``, the same optimizer, the same
random draws) and compares the loss and every gradient of step 0, then every parameter after the last step,
as whole tensors, within a tolerance fit for the dtype. For a pipeline plan the one process trains as the
pipeline does: on the plan's micro-batches (the batch's rows in order) one after another, their gradients
added up, the loss their mean (gradient accumulation). Without random or batch-coupled ops that is the
whole batch's step up to rounding; with dropout it is the step whose masks a pipeline can draw (each
micro-batch's forward draws its own, as Megatron-LM's and torchtitan's pipelines do), and a batch norm sees
a micro-batch, as it does in the pipeline.

A run whose ranks never hold the whole model (``meta_init``, ``weights``) cannot hold that model beside every
rank: :func:`file_reference` starts the one-process run as a process of its own on rank 0, before the ranks
train; it builds the model whole on the CPU from the same seed (or weights, or checkpoint), runs the same
steps and writes a safetensors file (the loss and gradients of step 0, the parameters after the last step,
each with its largest magnitude). Each rank then compares only its own shards with the file's slices
(:class:`FileReference`), reading only those bytes. The ranks share the file: one host.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from runtime import checkpoint, random_ops
from runtime.planned_step import StepResult
from runtime.run_setup import RunOptions, build_run_model, load_plan, make_optimizer

#: (rtol, atol) of a sharded result against one process, by dtype: sums in another order round apart.
TOLERANCE = {
    torch.float64: (1e-9, 1e-12),
    torch.float32: (1e-4, 1e-5),
    torch.bfloat16: (4e-2, 4e-2),
    torch.float16: (1e-2, 1e-3),
}


#: Elements compared at a time: the differences are taken in float64, and a whole embedding table's at once
#: (0.5 G elements of llama3-8b) would cost a rank more memory than its shards of the model.
COMPARED_AT_ONCE = 1 << 22


class CheckFailed(RuntimeError):
    """The planned run differs from one process; the message names the first tensor that does."""


@contextlib.contextmanager
def naming_randomness(drawn: Mapping[str, int]) -> Iterator[None]:
    """A check that fails on a step with random ops (``drawn``: count by op) says so: the draws are the
    first suspect."""
    try:
        yield
    except CheckFailed as error:
        if not drawn:
            raise
        ops = ", ".join(f"{count} {op}" for op, count in drawn.items())
        raise CheckFailed(
            f"{error}; the step draws random numbers ({ops}), which the planned step draws as one process"
            " does: does the model draw outside its traced ops? Check with dropout off for the rest"
        ) from error


def computed_in(module: torch.nn.Module) -> torch.dtype:
    """The dtype a module without a compute dtype computes in: its parameters' (a loss a bf16 model makes
    in float32 rounds apart as bf16 does)."""
    return next((p.dtype for p in module.parameters() if p.is_floating_point()), torch.float32)


def adam_drift(options: RunOptions) -> float:
    """How far apart two layouts may move a weight: Adam divides by the gradient's running scale, so a
    gradient that is rounding noise (a key bias: softmax ignores it) still moves its weight by up to lr a
    step, differently on each layout."""
    return 2 * options.lr * options.steps if options.optimizer == "adamw" else 0.0


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
    microbatches: int = 1
    """A pipeline plan's micro-batches: the step is theirs, one after another (:func:`microbatches_of`)."""

    def forward_backward(self) -> torch.Tensor:
        """One forward and backward on the example inputs (on each micro-batch of their rows in turn, the
        gradients added up and divided by their count); the loss (their mean; the gradients in ``.grad``)."""
        from strategies.graph.capture import call_module, default_loss, microbatch_rows

        assert self.optimizer is not None
        self.optimizer.zero_grad(set_to_none=True)
        losses = []
        for inputs in microbatch_rows(self.spec.example_inputs, self.microbatches):
            output = call_module(self.module, inputs, self.compute_dtype)
            loss = (self.spec.loss_fn or default_loss)(output)
            (loss / self.microbatches).backward()
            losses.append(loss.detach())
        return torch.stack(losses).mean()

    @property
    def computed_in(self) -> torch.dtype:
        """The dtype the step computes in (its tolerance): the compute dtype, or the parameters'."""
        return self.compute_dtype or computed_in(self.module)

    def step(self, planned: StepResult | None = None) -> None:
        """One step; with ``planned`` (the planned step's result) compare its loss and every gradient."""
        assert self.optimizer is not None
        loss = self.forward_backward()
        if planned is not None:
            computed = self.computed_in  # a sum in bf16 rounds apart as bf16 does, whatever it is kept in
            with naming_randomness(self.random_ops):
                compare("loss", planned.loss.full_tensor(), loss, dtype=computed)
                for name, gradient in planned.gradients.items():
                    held = self.module.get_parameter(name)
                    expected = torch.zeros_like(held) if held.grad is None else held.grad
                    compare(f"{name}.grad", gradient.full_tensor(), expected, dtype=computed)
        self.optimizer.step()

    def take(self, parameters: Mapping[str, torch.nn.Parameter], optimizer: torch.optim.Optimizer) -> None:
        """Start from the weights and optimizer state a checkpoint just gave the ranks."""
        from torch.distributed.tensor import DTensor
        from torch.utils._pytree import tree_map

        assert self.optimizer is not None
        with torch.no_grad():
            for name, parameter in self.module.named_parameters():
                parameter.copy_(parameters[name].full_tensor())
        whole = tree_map(lambda t: t.full_tensor() if isinstance(t, DTensor) else t, optimizer.state_dict())
        self.optimizer.load_state_dict(whole)

    def compare_parameters(self, parameters: Mapping[str, torch.nn.Parameter], options: RunOptions) -> None:
        """Every parameter after the last step (:func:`adam_drift` more apart after AdamW)."""
        held = dict(self.module.named_parameters())
        with naming_randomness(self.random_ops):
            for name, parameter in parameters.items():
                what = f"{name} after {options.steps} steps"
                expected = held[name].detach()
                compare(
                    what, parameter.full_tensor(), expected, adam_drift(options), dtype=self.compute_dtype
                )


def microbatches_of(plan: Mapping[str, Any]) -> int:
    """How many micro-batches a step of ``plan`` runs: a pipeline plan's, else one."""
    return int(plan.get("pipeline", {}).get("microbatches", 1))


def file_reference(options: RunOptions) -> Path:
    """The file of the one-process run of ``options`` (:func:`write_reference`), written by a fresh process
    on rank 0 while the other ranks wait; every rank calls it and gets its path."""
    answer: list[Any] = [None]
    if dist.get_rank() == 0:
        path = Path(tempfile.mkdtemp(prefix="autoshard-reference-")) / "reference.safetensors"
        command = [
            sys.executable,
            "-m",
            "runtime.one_process",
            json.dumps(dataclasses.asdict(options)),
            str(path),
        ]
        here = str(Path(__file__).resolve().parents[1])  # this checkout's packages, whatever the cwd
        paths = os.pathsep.join(filter(None, (here, os.environ.get("PYTHONPATH"))))
        done = subprocess.run(
            command, env={**os.environ, "PYTHONPATH": paths}, capture_output=True, text=True
        )
        answer[0] = str(path) if done.returncode == 0 else RuntimeError(_last_line(done.stderr))
    dist.broadcast_object_list(answer, src=0)
    if isinstance(answer[0], Exception):
        raise RuntimeError(f"--check: the one-process run failed: {answer[0]}")
    return Path(answer[0])


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def write_reference(options: RunOptions, path: Path) -> None:
    """Run ``options``' steps on one process, the model whole, and write what the ranks compare with."""
    from safetensors.torch import save_file

    from runtime.apply import compute_dtype_of
    from runtime.parameter_shards import open_weights

    plan = load_plan(options.plan)
    spec, _ = build_run_model(options, plan, whole=True)
    if options.weights:
        open_weights(options.weights).fill_whole(spec.module)
    reference = Reference(spec.module, spec, compute_dtype_of(plan), microbatches=microbatches_of(plan))
    reference.optimizer = make_optimizer(options.optimizer, spec.module.parameters(), options.lr)
    if options.load:
        checkpoint.load(spec.module, reference.optimizer, options.load)
    held: dict[str, torch.Tensor] = {}
    for index in range(options.steps):
        random_ops.seed_step(options.seed, index)
        loss = reference.forward_backward()
        if index == 0:
            _keep(held, "loss", loss.reshape(1))
            for name, parameter in spec.module.named_parameters():
                _keep(
                    held,
                    f"grad.{name}",
                    torch.zeros_like(parameter) if parameter.grad is None else parameter.grad,
                )
        reference.optimizer.step()
    for name, parameter in spec.module.named_parameters():
        _keep(held, f"param.{name}", parameter)
    save_file(held, str(path))


def _keep(held: dict[str, torch.Tensor], key: str, value: torch.Tensor) -> None:
    held[key] = value.detach().contiguous()
    held[f"scale.{key}"] = value.detach().abs().max().double().reshape(1)


@dataclass
class FileReference:
    """The one-process run's file, each rank comparing its own shards with the file's slices."""

    path: Path
    computed_in: torch.dtype
    """The dtype the step computes in (its tolerance)."""
    random_ops: dict[str, int] = dataclasses.field(default_factory=dict)

    def step(self, planned: StepResult | None = None) -> None:
        """With ``planned`` (step 0's result): its loss and this rank's part of every gradient."""
        if planned is None:
            return
        with naming_randomness(self.random_ops):
            self._compare("loss", "loss", planned.loss.full_tensor().reshape(1))
            for name, gradient in planned.gradients.items():
                self._compare(f"{name}.grad", f"grad.{name}", gradient)

    @functools.cached_property
    def entries(self) -> dict[str, Any]:
        """Where each tensor lies in the file (its header, read once)."""
        from runtime.safetensors_slices import entries

        return entries(self.path)

    def take(self, parameters: Mapping[str, torch.nn.Parameter], optimizer: torch.optim.Optimizer) -> None:
        """Nothing: the one-process run started from the checkpoint itself."""

    def compare_parameters(self, parameters: Mapping[str, torch.nn.Parameter], options: RunOptions) -> None:
        """This rank's part of every parameter after the last step."""
        with naming_randomness(self.random_ops):
            for name, parameter in parameters.items():
                self._compare(
                    f"{name} after {options.steps} steps", f"param.{name}", parameter, adam_drift(options)
                )

    def _compare(self, what: str, key: str, value: torch.Tensor, extra_atol: float = 0.0) -> None:
        from torch.distributed.tensor import DTensor

        from runtime.parameter_shards import slices_of
        from runtime.safetensors_slices import read

        held = self.entries
        if isinstance(value, DTensor):  # this rank's part only, read by rows
            expected, value = read(self.path, held[key], slices_of(value)), value.to_local()
        else:
            expected = read(self.path, held[key])
        scale = float(read(self.path, held[f"scale.{key}"]))
        compare(what, value.detach(), expected, extra_atol, dtype=self.computed_in, scale=scale)

    def remove(self) -> None:
        """The file and its folder, once every rank compared (rank 0)."""
        self.path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self.path.parent.rmdir()


def compare(
    what: str,
    actual: torch.Tensor,
    expected: torch.Tensor,
    extra_atol: float = 0.0,
    dtype: torch.dtype | None = None,
    scale: float | None = None,
) -> None:
    """Refuse ``actual`` unless it is ``expected`` within the tolerance of ``dtype`` (the dtype the values
    were computed in; default ``expected``'s), relative to ``scale`` (default: ``expected``'s largest
    magnitude; a slice of a tensor passes the whole tensor's)."""
    rtol, atol = TOLERANCE.get(dtype or expected.dtype, (1e-4, 1e-5))
    atol += extra_atol
    if actual.shape != expected.shape:
        raise CheckFailed(
            f"{what}: shape {tuple(actual.shape)} differs from one process's {tuple(expected.shape)}"
        )
    flat_actual, flat_expected = actual.reshape(-1), expected.reshape(-1)
    pieces = range(0, flat_expected.numel(), COMPARED_AT_ONCE)
    largest = (
        max((float(flat_expected[k : k + COMPARED_AT_ONCE].abs().max()) for k in pieces), default=0.0)
        if scale is None
        else scale
    )
    allowed = atol + rtol * largest
    worst, within = 0.0, True
    for k in pieces:
        difference = (
            flat_actual[k : k + COMPARED_AT_ONCE].double() - flat_expected[k : k + COMPARED_AT_ONCE].double()
        ).abs()
        within = within and bool((difference <= allowed).all())  # NaN is never within
        worst = max(worst, float(difference.max()), key=lambda value: (math.isnan(value), value))
    if not within:
        raise CheckFailed(
            f"{what} differs from one process: largest difference {worst:.3g} "
            f"(allowed {allowed:.3g} for {dtype or expected.dtype})"
        )


def main() -> None:
    """``python -m runtime.one_process OPTIONS_JSON PATH``: :func:`write_reference`."""
    write_reference(RunOptions(**json.loads(sys.argv[1])), Path(sys.argv[2]))


if __name__ == "__main__":
    main()
