"""Conformance harness: every strategy an op emits, executed by real DTensor on a 4-rank gloo group.

For a case (an op and its arguments) and a mesh, each strategy is checked on all ranks:

1. one random global tensor per tensor argument (same seed on every rank);
2. DTensors with the strategy's input placements (``Partial`` inputs are random splits whose
   reduction is the global value);
3. the op runs on them under ``CommDebugMode``: no collective may run (the inputs already have the
   placements the strategy asks for);
4. every tensor output has the predicted placement, and its full tensor equals the single-process
   result.

The process group is the session's one (`tests/conftest.py`), shared with the runtime tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from runtime.worker import device_mesh
from strategies.cost.mesh import make_mesh
from strategies.ops.generate import op_strategies
from strategies.tensor_meta import TensorMeta
from tests.gloo_ranks import JOB_TIMEOUT_S, GlooRanks, RankError

MESHES = ((4,), (2, 2))


@dataclass(frozen=True)
class Ints:
    """An integer tensor argument with values in ``[low, high)`` (indices, targets)."""

    shape: tuple[int, ...]
    high: int
    low: int = 0
    dtype: torch.dtype = torch.int64

    @property
    def meta(self) -> TensorMeta:
        return TensorMeta(self.shape, self.dtype)


@dataclass(frozen=True)
class Fixed:
    """A tensor argument with given values (group offsets, a chosen mask)."""

    values: tuple
    dtype: torch.dtype = torch.int64

    @property
    def meta(self) -> TensorMeta:
        return TensorMeta(tuple(torch.tensor(self.values).shape), self.dtype)


@dataclass(frozen=True)
class Case:
    """One op call to check: ``op`` as ``aten.name.overload``, tensors as TensorMeta or :class:`Ints`."""

    op: str
    args: tuple
    kwargs: dict = field(default_factory=dict)
    check_values: bool = True
    """False for random ops (dropout): placements and shapes are still checked."""
    atol: float = 1e-4
    rtol: float = 1e-4

    def __str__(self) -> str:
        return f"{self.op}{tuple(str(a) if isinstance(a, TensorMeta) else a for a in self.args)}"


def resolve_op(name: str) -> Any:
    namespace, op_name, overload = name.split(".")
    return getattr(getattr(getattr(torch.ops, namespace), op_name), overload)


def _metas(tree: Any) -> Any:
    if isinstance(tree, (Ints, Fixed)):
        return tree.meta
    if isinstance(tree, (list, tuple)):
        return type(tree)(_metas(t) for t in tree)
    if isinstance(tree, dict):
        return {k: _metas(v) for k, v in tree.items()}
    return tree


def strategy_list(case: Case, mesh_shape: tuple[int, ...]) -> list[tuple[list, list]]:
    """``(input specs, output specs)`` of every strategy of a case, as plain lists."""
    strategies = op_strategies(
        resolve_op(case.op), _metas(case.args), _metas(case.kwargs), make_mesh(mesh_shape)
    )
    return [
        (strategies.input_specs[i].tolist(), strategies.output_specs[i].tolist())
        for i in range(len(strategies))
    ]


class ProcessGroup:
    """Four spawned gloo ranks (:class:`tests.gloo_ranks.GlooRanks`) that check conformance cases."""

    def __init__(self, ranks: GlooRanks) -> None:
        self.ranks = ranks

    def check(self, case: Case, mesh_shape: tuple[int, ...]) -> list[str]:
        """Failures (one line each) of every strategy of ``case`` on a mesh; empty when all conform."""
        strategies = strategy_list(case, mesh_shape)
        try:
            answers = self.ranks.run(_check_job, case, mesh_shape, strategies)
        except TimeoutError:
            return [f"{case} on {mesh_shape}: timed out after {JOB_TIMEOUT_S} s"]
        failures: list[str] = []
        for answer in answers:
            lines = (
                [f"{case} on {mesh_shape}: harness error\n{answer.traceback}"]
                if isinstance(answer, RankError)
                else answer
            )
            for line in lines:
                if line not in failures:
                    failures.append(line)
        if not strategies:
            failures.append(f"{case} on {mesh_shape}: no strategies")
        return failures


@pytest.fixture(scope="module")
def gloo(ranks: GlooRanks) -> ProcessGroup:
    """The session's gloo ranks (`tests/conftest.py`), checking this module's cases."""
    return ProcessGroup(ranks)


# ---------------------------------------------------------------------------------------------- ranks


def _check_job(case: Case, mesh_shape: tuple[int, ...], strategies: list[tuple[list, list]]) -> list[str]:
    """One rank's share of checking ``case``, on the rank's one mesh of that shape."""
    return _check_case(case, device_mesh("cpu", mesh_shape), strategies)


def _global_tensor(arg: Any, gen: torch.Generator) -> Any:
    if isinstance(arg, Ints):
        return torch.randint(arg.low, arg.high, arg.shape, generator=gen, dtype=arg.dtype)
    if isinstance(arg, Fixed):
        return torch.tensor(arg.values, dtype=arg.dtype)
    if isinstance(arg, TensorMeta):
        if arg.dtype.is_floating_point:
            return torch.randn(arg.shape, generator=gen, dtype=torch.float32).to(arg.dtype)
        if arg.dtype == torch.bool:
            return torch.rand(arg.shape, generator=gen) > 0.5
        return torch.randint(0, 8, arg.shape, generator=gen, dtype=arg.dtype)
    if isinstance(arg, (list, tuple)):
        return type(arg)(_global_tensor(a, gen) for a in arg)
    if isinstance(arg, dict):
        return {k: _global_tensor(v, gen) for k, v in arg.items()}
    return arg


def _partial_pieces(value: torch.Tensor, code: int, n: int, gen: torch.Generator) -> list[torch.Tensor]:
    """``n`` local values whose reduction (sum, avg, max, min by ``code``) is ``value``."""
    from strategies.placement import P_AVG, P_MAX, P

    noise = [torch.randn(value.shape, generator=gen).to(value.dtype) for _ in range(n)]
    if code == P:
        pieces = noise[: n - 1]
        return [*pieces, value - sum(pieces, torch.zeros_like(value))]
    if code == P_AVG:
        mean = sum(noise, torch.zeros_like(value)) / n
        return [value + z - mean for z in noise]
    sign = -1 if code == P_MAX else 1
    return [value if i == 0 else value + sign * z.abs() for i, z in enumerate(noise)]


def _to_dtensor(value: torch.Tensor, spec: list[int], mesh: Any, gen: torch.Generator) -> Any:
    """A DTensor of ``value`` with placements ``spec`` (random splits on partial axes)."""
    from torch.distributed.tensor import DTensor, Replicate, distribute_tensor

    from strategies.placement import NONE, R, is_partial, to_dtensor

    spec = [R if c == NONE else c for c in spec]  # an input the strategy does not read: any placement
    placements = to_dtensor(spec)
    whole = [Replicate() if is_partial(c) else p for c, p in zip(spec, placements, strict=False)]
    local = value
    coords = mesh.get_coordinate()
    for axis, code in enumerate(spec):  # the partial value this rank holds, before sharding
        if is_partial(code):
            local = _partial_pieces(local, code, mesh.shape[axis], gen)[coords[axis]]
    local = distribute_tensor(local, mesh, whole, src_data_rank=None).to_local()
    return DTensor.from_local(
        local, mesh, placements, run_check=False, shape=value.shape, stride=value.stride()
    )


def _check_case(case: Case, mesh: Any, strategies: list[tuple[list, list]]) -> list[str]:
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.utils._pytree import tree_flatten, tree_unflatten

    from strategies.placement import spec_text

    op = resolve_op(case.op)
    gen = torch.Generator().manual_seed(1234)
    args = _global_tensor(case.args, gen)
    kwargs = _global_tensor(case.kwargs, gen)
    expected = op(*args, **kwargs)
    expected_flat = list(expected) if isinstance(expected, (tuple, list)) else [expected]
    leaves, tree = tree_flatten((args, kwargs))
    tensor_slots = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
    failures: list[str] = []
    for index, (input_specs, output_specs) in enumerate(strategies):
        label = f"{case} on {tuple(mesh.shape)} strategy {index} inputs {[spec_text(s) for s in input_specs]}"
        split_gen = torch.Generator().manual_seed(99 + index)
        new_leaves = list(leaves)
        for slot, spec in zip(tensor_slots, input_specs, strict=False):
            new_leaves[slot] = _to_dtensor(leaves[slot], spec, mesh, split_gen)
        dt_args, dt_kwargs = tree_unflatten(new_leaves, tree)
        error = ""
        try:
            with CommDebugMode() as comm:
                out = op(*dt_args, **dt_kwargs)
        except Exception as e:
            error = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
        if not _every_rank_ok(not error):  # one rank failing alone must not hang the others' gathers
            failures.append(f"{label}: DTensor raised {error or 'on another rank'}")
            continue
        if comm.get_total_counts():
            failures.append(f"{label}: inputs were redistributed ({dict(comm.get_comm_counts())})")
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        dtypes_match = all(
            not hasattr(got, "to_local") or got.to_local().dtype == want.dtype
            for got, want in zip(outs, expected_flat, strict=False)
        )
        if not _every_rank_ok(dtypes_match):
            failures.append(f"{label}: a local output has another dtype than the single-process result")
            continue
        try:
            failures.extend(_check_outputs(case, label, outs, output_specs, expected_flat))
        except Exception as e:
            failures.append(
                f"{label}: checking outputs raised {type(e).__name__}: {str(e).splitlines()[0][:300]}"
            )
    return failures


def _every_rank_ok(ok: bool) -> bool:
    """True when ``ok`` holds on every rank (one all-reduce)."""
    import torch.distributed as dist

    flag = torch.tensor([0 if ok else 1])
    dist.all_reduce(flag)
    return int(flag.item()) == 0


def _check_outputs(
    case: Case, label: str, outs: list[Any], output_specs: list, expected_flat: list[Any]
) -> list[str]:
    """Placement, shape and values of each DTensor output against the prediction and one process."""
    from torch.distributed.tensor import DTensor

    from strategies.placement import from_dtensor, spec_text

    failures: list[str] = []
    for k, (got, want_spec) in enumerate(zip(outs, output_specs, strict=False)):
        if not isinstance(got, DTensor):
            continue
        have = list(from_dtensor(got.placements))
        if have != want_spec:
            failures.append(
                f"{label}: output {k} placement {spec_text(have)}, predicted {spec_text(want_spec)}"
            )
            continue
        full = got.full_tensor()
        want = expected_flat[k]
        if tuple(full.shape) != tuple(want.shape):
            failures.append(f"{label}: output {k} shape {tuple(full.shape)} != {tuple(want.shape)}")
        elif case.check_values and not torch.allclose(
            full.float(), want.float(), atol=case.atol, rtol=case.rtol, equal_nan=True
        ):
            err = (full.float() - want.float()).abs().max().item()
            failures.append(f"{label}: output {k} differs from one process (max abs error {err:.3g})")
    return failures
