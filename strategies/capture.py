"""Graph capture: one training step of a module as a joint forward + backward aten graph on fake tensors.

``capture_joint`` traces ``loss = loss_fn(module(*inputs))`` and ``torch.autograd.grad(loss, ...)`` with
``make_fx(tracing_mode="fake")``: every node carries its output's shape and dtype in ``node.meta["val"]``
and no real memory is used. Parameters and buffers (which may live on the meta device) become fake CPU
tensors first, so CPU kernels and decompositions are the ones traced (TORCH_NOTES: fake CUDA tensors
abort in SDPA on a CPU-only build). ``op_calls`` then reads each op node the way ``op_strategies``
takes it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.func import functional_call
from torch.fx.experimental.proxy_tensor import make_fx

from strategies.tensor_meta import TensorMeta, flatten_outputs

LossFn = Callable[[Any], torch.Tensor]


def default_loss(output: Any) -> torch.Tensor:
    """The output's ``.loss`` if it has one, else the sum of the output (DESIGN.md)."""
    loss = getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    if isinstance(output, torch.Tensor):
        return output.sum()
    raise TypeError(f"loss: cannot make a loss of a {type(output).__name__}; pass loss_fn")


def capture_joint(
    module: nn.Module, inputs: Sequence[Any], loss_fn: LossFn | None = None
) -> torch.fx.GraphModule:
    """The joint graph of one step: placeholders are parameters, buffers, then inputs; outputs are
    ``(loss, gradients of parameters, gradients of floating inputs that require grad)``."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    loss_fn = loss_fn or default_loss
    mode = FakeTensorMode(allow_non_fake_inputs=False)
    params = {name: _fake(p, mode, requires_grad=True) for name, p in module.named_parameters()}
    buffers = {name: _fake(b, mode) for name, b in module.named_buffers()}
    fake_inputs = [_fake(x, mode, x.requires_grad) if isinstance(x, torch.Tensor) else x for x in inputs]

    def step(params: dict, buffers: dict, *inputs: Any) -> tuple:
        loss = loss_fn(functional_call(module, {**params, **buffers}, tuple(inputs)))
        wrt = [*params.values(), *(x for x in inputs if isinstance(x, torch.Tensor) and x.requires_grad)]
        return loss, torch.autograd.grad(loss, wrt)

    return make_fx(step, tracing_mode="fake")(params, buffers, *fake_inputs)


def _fake(t: torch.Tensor, mode: Any, requires_grad: bool = False) -> torch.Tensor:
    """A fake CPU tensor with ``t``'s shape, stride and dtype (``t`` may be real, meta or fake)."""
    with mode:
        out = torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device="cpu")
    return out.requires_grad_(requires_grad and (t.dtype.is_floating_point or t.dtype.is_complex))


@dataclass
class OpCall:
    """One ``call_function`` node as ``op_strategies`` sees it, and where its tensor arguments come from."""

    name: str
    op: Any
    args: tuple
    kwargs: dict
    outputs: tuple[TensorMeta | None, ...]
    producers: list[tuple[str, int] | None] = field(default_factory=list)
    """Per flattened tensor argument: (producing node's name, its output index); None for a placeholder."""


def op_calls(gm: torch.fx.GraphModule) -> list[OpCall]:
    """Every ``call_function`` node, its fx node arguments replaced by TensorMeta of their ``meta["val"]``.

    A multi-output node becomes a tuple of TensorMeta (``None`` for non-tensors); other values stay as is.
    """
    calls = []
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        producers: list[tuple[str, int] | None] = []
        args = tuple(_meta_arg(a, producers) for a in node.args)
        kwargs = {k: _meta_arg(v, producers) for k, v in node.kwargs.items()}
        outputs = flatten_outputs(node.meta["val"])
        calls.append(OpCall(node.name, node.target, args, kwargs, outputs, producers))
    return calls


def _meta_arg(value: Any, producers: list[tuple[str, int] | None]) -> Any:
    """One fx argument with nodes replaced by TensorMeta; appends each tensor's producer, in order."""
    if isinstance(value, torch.fx.Node):
        val = value.meta.get("val")
        source = None if value.op == "placeholder" else value.name
        if isinstance(val, (tuple, list)):
            metas = tuple(TensorMeta.of(v) if isinstance(v, torch.Tensor) else None for v in val)
            producers.extend((source, k) if source else None for k, m in enumerate(metas) if m is not None)
            return metas
        if isinstance(val, torch.Tensor):
            producers.append((source, 0) if source else None)
            return TensorMeta.of(val)
        return val
    if isinstance(value, (list, tuple)):
        return type(value)(_meta_arg(v, producers) for v in value)
    return value
