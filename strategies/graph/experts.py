"""Mixture-of-experts layers: captured in float32 with bounded shapes, rewritten so experts can be sharded.

Capture (:func:`experts_capture`, around the trace of :func:`strategies.graph.capture.capture_step`):

- **float32 grouped products.** ``transformers`` runs experts as ``aten._grouped_mm`` by default. Its CPU
  kernel takes float32, bfloat16 and float16, but torch's fake-tensor (meta) rule demands bfloat16 (it copies
  the CUDA kernel's checks), so a float32 model could not be traced. For the trace only, a rule of ours
  takes the dtypes the CPU kernel takes (operands of one dtype, int32 offsets); torch's rule is back, and the
  fake-tensor cache holds none of our answers, once the trace ends.
- **Bounded shapes.** Routing whose shapes depend on the router's choices (``nonzero``, indexing by a mask, a
  loop over the experts hit) cannot be traced on fake tensors. The bound we capture is the worst case that
  drops nothing: every token goes to each of its ``top_k`` chosen experts, ``tokens * top_k`` rows sorted by
  expert, each expert's rows given by offsets (values, not shapes). That is exactly ``transformers``'
  ``grouped_mm`` experts, so experts declared eager (``experts_implementation="eager"``: a loop over
  ``nonzero``) are traced with that implementation, the same function (no token is dropped, no capacity to
  choose; only the order of the floating-point sums differs). Other code whose shapes depend on values
  fails capture with an error naming the module; :mod:`strategies.models.moe` shows the other bounded form
  (a fixed expert capacity, tokens past it dropped, as GShard).

Rewrite (:func:`explicit_expert_groups`, one of the planner's graph passes): every ``aten._grouped_mm``
with offsets becomes ``autoshard::grouped_mm(a, b, ends, starts)`` (:mod:`strategies.ops.grouped_mm_ops`),
``ends`` the offsets and ``starts = constant_pad_nd(ends, [1, -1])`` (each group starts where the one before
ends), so the plan can cut the experts' dim (expert parallelism); one without offsets is a ``bmm``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import torch
from torch import fx, nn

from strategies.graph.rewrite import new_call
from strategies.ops.grouped_mm_ops import GROUPED_MM

aten = torch.ops.aten

GROUPED_MM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
"""The operand dtypes ``aten._grouped_mm``'s CPU kernel runs (torch 2.13)."""
BOUNDED_EXPERTS = "grouped_mm"
"""The ``transformers`` experts implementation captured in place of ``eager`` (module docstring)."""


@contextmanager
def experts_capture(module: nn.Module) -> Iterator[None]:
    """While tracing ``module``: float32 ``_grouped_mm`` on fake tensors, and ``transformers`` experts
    declared eager run as ``grouped_mm`` (module docstring). Everything is as it was afterwards."""
    with ExitStack() as stack:
        stack.enter_context(_cpu_grouped_mm_fake_rule())
        stack.enter_context(_bounded_transformers_experts(module))
        yield


# ----------------------------------------------------------------------------------- fake rule


@contextmanager
def _cpu_grouped_mm_fake_rule() -> Iterator[None]:
    """Our fake rule for ``aten._grouped_mm`` while the block runs (fake tensors consult these rules before
    the meta kernel); afterwards torch's, with the cached answers of ours dropped."""
    from torch._subclasses import fake_impls

    op = aten._grouped_mm.default
    rules = fake_impls.op_implementations_dict
    saved = rules.get(op)
    rules[op] = _grouped_mm_fake
    try:
        yield
    finally:
        if saved is None:
            rules.pop(op, None)
        else:
            rules[op] = saved
        _drop_cached(op)


def _drop_cached(op: Any) -> None:
    """Remove ``op``'s entries from the fake-tensor dispatch cache (shared by every fake mode)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    for key in [key for key in FakeTensorMode.cache if key.key and key.key[0] is op]:
        del FakeTensorMode.cache[key]


def _grouped_mm_fake(
    mode: Any,
    func: Any,
    mat_a: torch.Tensor,
    mat_b: torch.Tensor,
    offs: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``aten._grouped_mm``'s output as the CPU kernel makes it, after the checks of its arguments."""
    name = "aten._grouped_mm"
    if mat_a.dtype != mat_b.dtype or mat_a.dtype not in GROUPED_MM_DTYPES:
        raise RuntimeError(f"{name}: operands of {mat_a.dtype} and {mat_b.dtype}, not {GROUPED_MM_DTYPES}")
    if bias is not None or out_dtype not in (None, mat_a.dtype):
        raise RuntimeError(f"{name}: bias and another output dtype are not supported")
    if mat_a.ndim not in (2, 3) or mat_b.ndim not in (2, 3) or mat_a.shape[-1] != mat_b.shape[-2]:
        raise RuntimeError(f"{name}: operands {list(mat_a.shape)} and {list(mat_b.shape)} do not multiply")
    grouped = mat_a.ndim == 2 or mat_b.ndim == 2
    if grouped != (offs is not None) or (offs is not None and (offs.ndim != 1 or offs.dtype != torch.int32)):
        raise RuntimeError(f"{name}: 2-D operands need 1-D int32 offsets, 3-D x 3-D none")
    groups = offs.shape[0] if offs is not None else mat_a.shape[0]
    if mat_a.ndim == 2 and mat_b.ndim == 2:
        shape: tuple[int, ...] = (groups, mat_a.shape[0], mat_b.shape[1])
    elif mat_a.ndim == 3 and mat_b.ndim == 3:
        shape = (groups, mat_a.shape[1], mat_b.shape[2])
    else:
        if (mat_b if mat_b.ndim == 3 else mat_a).shape[0] != groups:
            raise RuntimeError(f"{name}: {groups} offsets for {list(mat_a.shape)} x {list(mat_b.shape)}")
        shape = (mat_a.shape[-2], mat_b.shape[-1])
    with mode:
        return torch.empty(shape, dtype=mat_a.dtype, device=mat_a.device)


# ----------------------------------------------------------------------- transformers' experts


@contextmanager
def _bounded_transformers_experts(module: nn.Module) -> Iterator[None]:
    """Every ``transformers`` experts module of ``module`` declared ``eager`` runs as ``grouped_mm`` while the
    block runs (module docstring), its config's implementation restored afterwards."""
    configs = {id(c): c for c in map(_eager_experts_config, module.modules()) if c is not None}
    for config in configs.values():
        config._experts_implementation_internal = BOUNDED_EXPERTS
    try:
        yield
    finally:
        for config in configs.values():
            config._experts_implementation_internal = "eager"


def _eager_experts_config(module: nn.Module) -> Any:
    """The config of a ``transformers`` experts module (made by ``@use_experts_implementation``: it dispatches
    on ``config._experts_implementation``, has ``_is_expert_parallel``) that runs ``eager``; else None."""
    config = getattr(module, "config", None)
    if not hasattr(module, "_is_expert_parallel") or not hasattr(config, "_experts_implementation_internal"):
        return None
    return config if config._experts_implementation_internal == "eager" else None


# ------------------------------------------------------------------------------------- rewrite


def explicit_expert_groups(gm: fx.GraphModule) -> int:
    """Rewrite, in place, every ``aten._grouped_mm`` of ``gm`` (module docstring); returns how many became
    ``autoshard::grouped_mm``. One with a bias or another output dtype is left as it is."""
    graph = gm.graph
    starts: dict[fx.Node, fx.Node] = {}
    rewritten = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not aten._grouped_mm.default:
            continue
        a, b, offs, bias, out_dtype = _grouped_mm_args(node)
        if bias is not None or out_dtype not in (None, node.meta["val"].dtype):
            continue
        if offs is None:
            _replace(graph, node, aten.bmm.default, (a, b))
            continue
        if offs not in starts:  # made before the first product reading these offsets
            with graph.inserting_before(node):
                starts[offs] = new_call(graph, aten.constant_pad_nd.default, (offs, [1, -1]), like=node)
        _replace(graph, node, GROUPED_MM, (a, b, offs, starts[offs]))
        rewritten += 1
    graph.lint()
    gm.recompile()
    return rewritten


def _grouped_mm_args(node: fx.Node) -> tuple[Any, ...]:
    """``(self, mat2, offs, bias, out_dtype)`` of a ``_grouped_mm`` node, positional or keyword."""
    names = [argument.name for argument in aten._grouped_mm.default._schema.arguments]
    values = [*node.args, *(None for _ in range(len(names) - len(node.args)))]
    return tuple(node.kwargs.get(name, value) for name, value in zip(names, values, strict=True))


def _replace(graph: fx.Graph, node: fx.Node, target: Any, args: tuple) -> None:
    """Put ``target(*args)`` in place of ``node``, with its fake value and where ``node`` came from."""
    with graph.inserting_before(node):
        new = new_call(graph, target, args, like=node)
    node.replace_all_uses_with(new)
    graph.erase_node(node)
