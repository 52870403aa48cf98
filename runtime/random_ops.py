"""Random ops of a planned step (dropout's ``bernoulli_``, ``rand_like``, ``randint``, ...) drawn as one
process draws them, whatever their placements.

A sharded random op cannot draw only its local piece: the kernels do not tie an element's random number to its
index in the whole tensor. The CPU ``bernoulli_`` takes one number from the generator and draws the whole
tensor from it (MKL's stream, skipped ahead per thread), so every shard drawn alone starts the stream afresh
and gets its first elements; CUDA's kernels give element ``i`` the Philox subsequence of the thread that draws
it, a layout that depends on the tensor's size. DTensor's own answer, ``OffsetBasedRNGTracker``
(``torch.distributed.tensor._random``), starts each shard at another offset of one Philox stream: shards then
differ from one another, but not as one process's whole tensor does (pytorch/pytorch#168058), and it refuses
a CPU mesh (without it, DTensor on CPU draws every shard from the same state: the same mask on every shard).
A check against one process needs the same numbers, so this runtime does not use it.

What runs instead, on every device: **the whole draw**. The op runs on plain tensors of its global shape, from
the same generator state on every rank (:func:`seed_step` seeds each step alike), so every rank draws exactly
what one process draws and leaves its generator where one process leaves it; each rank then keeps its own
piece of each output, by its planned placements, and moves no data for it. An argument whose values the op
ignores (the ``self`` of ``bernoulli_``, ``uniform_``, ``rand_like``: only its shape, dtype and strides count)
is stood in for by an uninitialised tensor with the strides one process had (the captured graph's, so a
``memory_format``-preserving draw lays out alike); one whose values count (``bernoulli``'s probabilities, a
fused attention's query) is gathered whole, a collective the plan did not price (none in the zoo's
transformers: a CPU capture decomposes dropout into ``empty_like`` + ``bernoulli_``).

Memory: the whole output (a dropout mask of the whole activation, ``numel x itemsize`` bytes) exists on every
rank while it keeps its piece, and is freed before the next op; the step's measured peak counts it. Compute:
every rank draws the whole tensor, ``mesh size`` times one process's draws in all.

Backward: in the joint graph a mask is a value the backward reads, so forward and backward use the same one;
a mask the plan recomputes is drawn again from the generator state its forward drew from
(:func:`generator_state`, :func:`drawing_from`), the same numbers.
An op that re-draws its dropout from a saved Philox seed (a fused CUDA attention's backward) draws too, so it
also runs whole, from the seed its whole forward saved.

A pipeline's step is its micro-batches one after another: each random op draws its micro-batch's whole
tensor from the state one process has there (:func:`draw_over_stand_ins` finds it,
:class:`runtime.pipeline_step.PipelineStep` uses it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import fx
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.utils._pytree import tree_flatten, tree_map, tree_map_only

aten = torch.ops.aten

PATH = "whole draw: every rank draws the global tensor from the same state and keeps its piece"
"""Which path random ops take, as the run's report says it."""

_SHAPE_ONLY_SELF = {
    aten.bernoulli_,
    aten.uniform,
    aten.uniform_,
    aten.normal_,
    aten.cauchy,
    aten.cauchy_,
    aten.exponential,
    aten.exponential_,
    aten.geometric,
    aten.geometric_,
    aten.log_normal,
    aten.log_normal_,
    aten.random_,
    aten.rand_like,
    aten.randn_like,
    aten.randint_like,
}
"""Op packets whose ``self`` is read only for its shape, dtype and strides: the values are drawn over it."""

_DROPOUT_ARGUMENTS = ("dropout_p", "dropout")
_TRAIN_ARGUMENTS = ("train", "training")


def draws_random(op: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> bool:
    """Whether ``op(*args, **kwargs)`` draws from the generator: a seeded-random op (torch's
    ``nondeterministic_seeded`` tag), or an op with a dropout probability above 0 (a fused attention and its
    backward); not when its ``train`` argument is False or its dropout probability 0."""
    if not isinstance(op, torch._ops.OpOverload):
        return False
    named = _named_arguments(op, args, kwargs)
    if any(named.get(name) is False for name in _TRAIN_ARGUMENTS):
        return False
    dropout = [named[name] for name in _DROPOUT_ARGUMENTS if isinstance(named.get(name), float)]
    if dropout:
        return any(p > 0 for p in dropout)
    return torch.Tag.nondeterministic_seeded in op.tags


def random_ops(nodes: Sequence[fx.Node]) -> dict[str, int]:
    """The random ops among ``nodes`` (a captured step's), by op, how many of each."""
    found: dict[str, int] = {}
    for node in nodes:
        if draws_random(node.target, node.args, node.kwargs):
            found[str(node.target)] = found.get(str(node.target), 0) + 1
    return found


def run_whole(
    node: fx.Node, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> tuple[Any, list[torch.Tensor]]:
    """Run the random op of ``node`` on its arguments' whole tensors, as one process does (see the module).

    ``args``/``kwargs`` are ``node``'s, DTensors in their planned placements. Returns the op's result and the
    whole tensors it made (for the caller's memory count). An argument the op writes (``bernoulli_``'s
    ``self``) gets its own piece of the whole result and is returned as it is; a new output is returned whole
    (a plain tensor, every rank's alike) for the caller to cut to its planned placements.
    """
    op = node.target
    assert isinstance(op, torch._ops.OpOverload)
    schema = op._schema
    stands_in = op.overloadpacket in _SHAPE_ONLY_SELF or op is aten.bernoulli.p
    whole_args, whole_kwargs, made = list(args), dict(kwargs), []
    written: list[tuple[DTensor, torch.Tensor]] = []
    for index, argument in enumerate(schema.arguments):
        if index < len(args):
            value, source = args[index], node.args[index]
        elif argument.name in kwargs:
            value, source = kwargs[argument.name], node.kwargs[argument.name]
        else:
            continue
        meta = source.meta.get("val") if isinstance(source, fx.Node) else None
        if stands_in and argument.name == "self" and isinstance(value, DTensor):
            whole = _stand_in(value, meta)
        else:
            whole = tree_map(lambda v, m=meta: _gathered(v, m) if isinstance(v, DTensor) else v, value)
        made += [t for t in tree_flatten(whole)[0] if isinstance(t, torch.Tensor)]
        if argument.alias_info is not None and argument.alias_info.is_write and isinstance(value, DTensor):
            written.append((value, whole))
        if index < len(args):
            whole_args[index] = whole
        else:
            whole_kwargs[argument.name] = whole
    result = op(*whole_args, **whole_kwargs)
    for value, whole in written:  # in place: each rank keeps its piece of what one process wrote
        value.to_local().copy_(_piece(whole, value))
    if written and len(schema.returns) == 1 and schema.returns[0].alias_info is not None:
        return written[0][0], made  # bernoulli_ returns its self
    made += [t for t in tree_flatten(result)[0] if isinstance(t, torch.Tensor)]
    return result, made


def draw_over_stand_ins(node: fx.Node, device: torch.device) -> None:
    """Draw what ``node``'s random op draws, over stand-ins shaped as its captured arguments (zeros), and
    drop the numbers: the generator moves on exactly as the op moves it, for the length of a draw depends on
    the shapes it is drawn over, not their values (a pipeline finds so where each of its micro-batches' draws
    starts, :class:`runtime.pipeline_step.PipelineStep`)."""

    def zeros(meta: torch.Tensor) -> torch.Tensor:
        return torch.empty_strided(meta.shape, meta.stride(), dtype=meta.dtype, device=device).zero_()

    def stand_in(source: fx.Node) -> Any:
        return tree_map_only(torch.Tensor, zeros, source.meta["val"])

    args, kwargs = tree_map_only(fx.Node, stand_in, (node.args, node.kwargs))
    if isinstance(kwargs.get("device"), torch.device):  # captured on CPU fakes, drawn on the mesh's
        kwargs["device"] = device
    with torch.no_grad():
        node.target(*args, **kwargs)  # type: ignore[operator]


def seed_step(seed: int, step: int) -> None:
    """Seed every generator for step ``step`` of a run seeded ``seed``, alike on every rank: the planned step
    and its one-process reference then draw the same numbers (each seeds before its step), whatever the
    capture, the other steps or a checkpoint drew before."""
    torch.manual_seed(seed + step)


def generator_state(device_type: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The state of the generators a random op on ``device_type`` draws from (the CPU's, and the current
    CUDA device's), for :func:`drawing_from` to draw the same numbers again."""
    cuda = torch.cuda.get_rng_state() if device_type == "cuda" else None
    return torch.get_rng_state(), cuda


@contextlib.contextmanager
def drawing_from(state: tuple[torch.Tensor, torch.Tensor | None]) -> Iterator[None]:
    """Draw from ``state`` (a recomputation drawing what the forward drew), then leave the generators where
    they were: the rest of the step draws as if nothing had been made again."""
    cpu, cuda = state
    devices = [torch.cuda.current_device()] if cuda is not None else []
    with torch.random.fork_rng(devices=devices):
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state(cuda)
        yield


def _named_arguments(
    op: torch._ops.OpOverload, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> dict[str, Any]:
    """Every argument by name: given (positionally or by keyword), else its schema default."""
    named = {a.name: a.default_value for a in op._schema.arguments if a.has_default_value()}
    named.update((argument.name, value) for argument, value in zip(op._schema.arguments, args, strict=False))
    return {**named, **kwargs}


def _stand_in(value: DTensor, meta: Any) -> torch.Tensor:
    """An uninitialised tensor shaped as one process held ``value`` (the captured strides where known)."""
    device = value.to_local().device
    if isinstance(meta, torch.Tensor) and tuple(meta.shape) == tuple(value.shape):
        return torch.empty_strided(meta.shape, meta.stride(), dtype=meta.dtype, device=device)
    return torch.empty(value.shape, dtype=value.dtype, device=device)


def _gathered(value: DTensor, meta: Any) -> torch.Tensor:
    """The whole of ``value`` on this rank (a collective unless it is replicated), laid out as one process
    held it where the capture says."""
    whole = value.full_tensor()
    same_shape = isinstance(meta, torch.Tensor) and tuple(meta.shape) == tuple(whole.shape)
    if same_shape and meta.stride() != whole.stride():
        laid_out = torch.empty_strided(meta.shape, meta.stride(), dtype=whole.dtype, device=whole.device)
        whole = laid_out.copy_(whole)
    return whole


def _piece(whole: torch.Tensor, value: DTensor) -> torch.Tensor:
    """This rank's piece of ``whole`` in ``value``'s placements (no data moves)."""
    if any(p.is_partial() for p in value.placements):
        raise ValueError(
            f"it writes random numbers into a partial sum ({[str(p) for p in value.placements]}); "
            "plan its input Shard or Replicate"
        )
    return distribute_tensor(whole, value.device_mesh, value.placements, src_data_rank=None).to_local()
