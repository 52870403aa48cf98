"""Graph capture: one training step of a module as a joint forward + backward aten graph on fake tensors.

``capture_step`` traces ``loss = loss_fn(module(*inputs))`` and ``torch.autograd.grad(loss, ...)`` with
``make_fx(tracing_mode="fake")``: every node carries its output's shape and dtype in ``node.meta["val"]``
and no real memory is used. Parameters and buffers (which may live on the meta device) become fake CPU
tensors first, so CPU kernels and decompositions are the ones traced (TORCH_NOTES: fake CUDA tensors
abort in SDPA on a CPU-only build). The result, a :class:`JointGraph`, names the roles of the graph's
nodes (parameters, buffers, inputs, loss, gradients) and the module each op came from; ``op_calls``
then reads each op node the way ``op_strategies`` takes it.

Mixture-of-experts layers are traced in float32 with shapes bounded by every token going to each of its
chosen experts (:mod:`strategies.graph.experts`); other code whose shapes depend on tensor values stops
the capture with one line naming the innermost module that was running.

Module paths. ``make_fx(record_module_stack=True)`` gives forward nodes ``meta["nn_module_stack"]``
(module path -> (path, class), outermost first). Backward nodes get none, so while tracing, a pre-hook
on every autograd node of the step tags the ops its backward emits with the forward op's ``seq_nr`` (what
AOTAutograd does); a backward op then takes the module path of the forward op with the same ``seq_nr``,
and ops the autograd engine emits between nodes (gradient accumulation) take the common path of their
inputs. The hooks use ``torch.fx.traceback``'s seq_nr functions, which like the lazy graph module are
internal to PyTorch (pinned to 2.13/2.14 in pyproject); stack traces are not recorded (they cost time).
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx.config as fx_config
import torch.fx.traceback as fx_traceback
from torch import fx, nn
from torch._subclasses.fake_tensor import DynamicOutputShapeException
from torch.func import functional_call
from torch.fx._lazy_graph_module import _use_lazy_graph_module
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from strategies.graph.experts import experts_capture
from strategies.tensor_meta import TensorMeta, flatten_outputs

LossFn = Callable[[Any], torch.Tensor]


def default_loss(output: Any) -> torch.Tensor:
    """The output's ``.loss`` if it has one, else the sum of the output; a scalar output is its own sum, so
    a model that returns its loss adds no node."""
    loss = getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    if isinstance(output, torch.Tensor):
        return output if output.ndim == 0 else output.sum()
    raise TypeError(f"loss: cannot make a loss of a {type(output).__name__}; pass loss_fn")


class CaptureError(ValueError):
    """The module's training step could not be traced on fake tensors."""


@dataclass
class JointGraph:
    """One captured training step and the role of each of its nodes.

    ``gm(parameters, buffers, *tensor_inputs)`` (two dicts keyed like ``parameters`` / ``buffers``, the
    second holding ``constants`` too, then the example inputs' tensors in order) returns
    ``(loss, gradients)``: the gradients of the trainable parameters in ``parameters`` order, then those of
    the inputs that require grad. Its Python code is generated when first needed (a lazy graph module):
    planning reads only the graph.
    """

    gm: fx.GraphModule
    parameters: dict[str, fx.Node]
    """Placeholder per parameter by qualified name; a tied parameter once, under its first name."""
    tied: dict[str, list[str]]
    """First name of a parameter reachable under several names -> its other names (``lm_head.weight``)."""
    buffers: dict[str, fx.Node]
    """Placeholder per buffer by qualified name, then per tensor constant (see ``constants``)."""
    inputs: list[fx.Node]
    """Placeholders of the example inputs' tensors, in order (non-tensor inputs are baked into the graph)."""
    loss: fx.Node
    """The scalar loss."""
    gradients: dict[str, fx.Node]
    """Trainable parameter name -> the op node whose value is its gradient (zeros if the loss ignores it)."""
    input_gradients: dict[int, fx.Node]
    """Index into ``inputs`` -> the gradient of that input, for inputs that require grad."""
    order: list[fx.Node]
    """The op (``call_function``) nodes in execution order."""
    backward_start: int
    """Index into ``order`` of the first backward op: ``order[:backward_start]`` is the forward pass."""
    module_path: dict[str, str]
    """Op node name -> qualified name of the innermost module it came from (``"layers.3.attention.wq"``;
    ``""`` for the root module's own code); backward ops carry their forward op's module. Ops outside the
    module (the loss function, the gradient seed) have none."""
    constants: dict[str, torch.Tensor] = field(default_factory=dict)
    """Real tensors the step holds or makes from Python data (``torch.tensor([])`` in a KV cache, labels a
    ``loss_fn`` closes over), lifted to buffer placeholders named ``_tensor_constant<k>``; call
    ``gm(parameters, {**buffers, **constants}, …)``."""

    def refresh(self) -> None:
        """Re-read the loss, gradients, op order and module paths from ``gm``, after a graph pass rewrote
        it. Placeholders stay as they are; a new node's module path comes from the ``nn_module_stack``,
        ``seq_nr`` and ``autograd_backward`` meta the pass copied onto it, else from its inputs'."""
        fields = _outputs_and_order(self.gm, list(self.gradients), list(self.input_gradients))
        for name, value in fields.items():
            setattr(self, name, value)

    @property
    def forward_nodes(self) -> list[fx.Node]:
        return self.order[: self.backward_start]

    @property
    def backward_nodes(self) -> list[fx.Node]:
        return self.order[self.backward_start :]


def capture_step(
    module: nn.Module, inputs: Any, loss_fn: LossFn | None = None, compute_dtype: torch.dtype | None = None
) -> JointGraph:
    """Trace one training step of ``module`` on ``inputs`` into a :class:`JointGraph`.

    ``inputs`` is a sequence of positional arguments, a mapping of keyword arguments, or one tensor; tensors
    anywhere inside become graph inputs, other values are constants of the graph. ``loss_fn`` maps the
    module's output to a scalar (default: :func:`default_loss`). Real tensors the code holds apart from
    parameters and buffers (labels a ``loss_fn`` closes over, ``torch.tensor(...)`` in ``forward``) become
    ``constants``. Dead ops (values computed and never used) are removed. A module that cannot be traced on
    fake tensors (data-dependent control flow, ops without fake kernels, a TypeError in its code) raises
    :class:`CaptureError`; a loss that is not a floating scalar raises ValueError.

    ``compute_dtype`` (mixed precision, as FSDP2's ``MixedPrecisionPolicy(param_dtype=...)``): the parameters
    keep their dtype (fp32, with their gradients and the optimizer's state) and the step computes on copies
    in ``compute_dtype``, floating inputs cast alike; each parameter's copy is made just before its first
    reader, in that reader's module (:func:`_place_compute_copies`), and the gradient flows back through it.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    loss_fn = loss_fn or default_loss
    mode = FakeTensorMode(allow_non_fake_inputs=True)  # real tensors the code holds become constants
    params = {name: _fake(p, mode, p.requires_grad) for name, p in module.named_parameters()}
    buffers = {name: _fake(b, mode) for name, b in module.named_buffers()}
    leaves, spec = tree_flatten(_as_args_kwargs(inputs))
    tensor_at = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
    fake_inputs = [_fake(leaves[i], mode, leaves[i].requires_grad) for i in tensor_at]

    def step(params: dict, buffers: dict, *tensors: torch.Tensor) -> tuple:
        values = list(leaves)
        for i, tensor in zip(tensor_at, tensors, strict=True):
            values[i] = _compute_copy(tensor, compute_dtype)
        args, kwargs = tree_unflatten(values, spec)
        computed = {name: _compute_copy(p, compute_dtype) for name, p in params.items()}
        loss = _checked_loss(loss_fn(functional_call(module, {**computed, **buffers}, tuple(args), kwargs)))
        wrt = [*(p for p in params.values() if p.requires_grad), *(x for x in tensors if x.requires_grad)]
        _tag_backward_ops(loss)
        return loss, torch.autograd.grad(loss, wrt, materialize_grads=True)

    step._orig_mod = module  # type: ignore[attr-defined]  # the root of make_fx's module stack
    innermost = _InnermostModule(module)
    with fx_traceback.preserve_node_meta(), _no_stack_traces(), _use_lazy_graph_module(True):
        try:
            with experts_capture(module), innermost:
                trace = make_fx(step, tracing_mode="fake", record_module_stack=True)
                gm = trace(params, buffers, *fake_inputs)
        except ValueError:  # bad input, named (a loss that is not a scalar): as it is
            raise
        except DynamicOutputShapeException as error:
            raise CaptureError(
                f"model: {innermost.describe()} computes a shape from tensor values ({error.func}), which "
                "capture cannot bound; make its shapes follow from the input shapes (mixture-of-experts: "
                "every token to each chosen expert, or a fixed expert capacity; README, Mixture of experts)"
            ) from error
        except Exception as error:
            message = (str(error).strip().splitlines() or [""])[0]
            raise CaptureError(
                f"model: capturing one training step of {type(module).__name__} on fake tensors failed: "
                f"{type(error).__name__}: {message}"
            ) from error
        if gm.graph.eliminate_dead_code():
            gm.recompile()
        if compute_dtype is not None:
            _place_compute_copies(gm, list(params))
        constants = _lift_constants(gm, len(params), buffers)
    graph = _roles(gm, module, params, {**buffers, **constants}, fake_inputs)
    graph.constants = {name: getattr(gm, name) for name in constants}
    for name in constants:
        delattr(gm, name)
    return graph


def _compute_copy(tensor: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """``tensor`` in the compute dtype (a floating tensor of another dtype), else itself."""
    if dtype is None or not tensor.is_floating_point() or tensor.dtype == dtype:
        return tensor
    return tensor.to(dtype)


def _place_compute_copies(gm: fx.GraphModule, parameter_names: list[str]) -> None:
    """Move each parameter's compute copy (a ``_to_copy`` of its placeholder, made at the step's start) to
    just before its first reader and into its parameter's module: it is then made when FSDP2 would cast it,
    lives no longer than its readers need, and belongs to its layer (tied, repeated, recomputable with it).
    Each gradient's cast back to its parameter's dtype moves to just after the op that makes it."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    position = {node: index for index, node in enumerate(gm.graph.nodes)}
    for name, placeholder in zip(parameter_names, placeholders, strict=False):
        for copy in [u for u in placeholder.users if u.target is torch.ops.aten._to_copy.default]:
            if not copy.users:
                continue
            first = min(copy.users, key=position.__getitem__)
            first.prepend(copy)
            owner = name.rpartition(".")[0]
            if owner:  # the module path capture reads for forward ops
                copy.meta["nn_module_stack"] = {f"autoshard_compute_copy.{owner}": (owner, "")}
    _, *gradients = gm.graph.output_node().args[0]
    for gradient in gradients:  # each gradient back in its parameter's dtype as soon as it is made (autograd
        source = gradient.args[0] if gradient.target is torch.ops.aten._to_copy.default else None
        if isinstance(source, fx.Node) and source.op == "call_function":  # casts them all at the end)
            source.append(gradient)
    gm.recompile()


def capture_joint(module: nn.Module, inputs: Any, loss_fn: LossFn | None = None) -> fx.GraphModule:
    """The joint graph of one step (``capture_step(...).gm``): placeholders are parameters, buffers, then
    inputs; outputs are ``(loss, gradients of parameters, gradients of floating inputs needing them)``."""
    return capture_step(module, inputs, loss_fn).gm


def input_tensors(inputs: Any) -> list[torch.Tensor]:
    """The tensors of example inputs in the order the captured step takes them (``JointGraph.inputs``)."""
    leaves, _ = tree_flatten(_as_args_kwargs(inputs))
    return [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]


def first_rows(inputs: Any, rows: int) -> Any:
    """Example inputs cut to their first ``rows`` (every tensor's first dim is the batch): one micro-batch."""
    return tree_map(lambda value: value[:rows] if isinstance(value, torch.Tensor) else value, inputs)


def microbatch_rows(inputs: Any, microbatches: int) -> list[Any]:
    """Example inputs (or a list of tensors) as ``microbatches`` equal parts of their rows, in order (every
    tensor's first dim is the batch): a pipeline's micro-batches."""
    if microbatches == 1:
        return [inputs]

    def rows(index: int) -> Any:
        def part(value: Any) -> Any:
            if not isinstance(value, torch.Tensor):
                return value
            size = value.shape[0] // microbatches
            return value[index * size : (index + 1) * size]

        return tree_map(part, inputs)

    return [rows(index) for index in range(microbatches)]


def call_module(module: nn.Module, inputs: Any, compute_dtype: torch.dtype | None = None) -> Any:
    """``module(*args, **kwargs)`` for example inputs as :func:`capture_step` takes them; with
    ``compute_dtype``, on copies of the parameters and floating inputs in it, as the captured step computes
    (the gradients still flow to the parameters)."""
    args, kwargs = _as_args_kwargs(inputs)
    if compute_dtype is None:
        return module(*args, **kwargs)
    copies = {name: _compute_copy(p, compute_dtype) for name, p in module.named_parameters()}
    args, kwargs = tree_map(
        lambda v: _compute_copy(v, compute_dtype) if isinstance(v, torch.Tensor) else v, (args, kwargs)
    )
    return functional_call(module, copies, args, kwargs)


def _as_args_kwargs(inputs: Any) -> tuple[tuple, dict]:
    """Example inputs as ``(args, kwargs)``: a mapping is keywords, a tensor one argument, else positions."""
    if isinstance(inputs, Mapping):
        return (), dict(inputs)
    if isinstance(inputs, torch.Tensor):
        return (inputs,), {}
    return tuple(inputs), {}


def _checked_loss(loss: Any) -> torch.Tensor:
    """The loss, refused unless it is a floating scalar tensor (``autograd.grad`` needs one)."""
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.dtype.is_floating_point:
        what = f"a {tuple(loss.shape)} {loss.dtype} tensor" if isinstance(loss, torch.Tensor) else type(loss)
        raise ValueError(f"loss: loss_fn must return a floating scalar tensor, got {what}")
    return loss if loss.ndim == 0 else loss.reshape(())


def _fake(t: torch.Tensor, mode: Any, requires_grad: bool = False) -> torch.Tensor:
    """A fake CPU tensor with ``t``'s shape, stride and dtype (``t`` may be real, meta or fake)."""
    with mode:
        out = torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device="cpu")
    return out.requires_grad_(requires_grad and (t.dtype.is_floating_point or t.dtype.is_complex))


class _InnermostModule:
    """While entered, the qualified name of the innermost module whose forward is running: the one to name
    when tracing fails inside it (forward hooks on every submodule, removed on exit; a forward that raises
    runs no post-hook, so the failing module stays on top)."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.running: list[str] = []
        self.handles: list[Any] = []

    def __enter__(self) -> _InnermostModule:
        for name, sub in self.module.named_modules():
            self.handles.append(sub.register_forward_pre_hook(functools.partial(self._enter, name)))
            self.handles.append(sub.register_forward_hook(self._leave))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()

    def _enter(self, name: str, module: nn.Module, args: Any) -> None:
        self.running.append(name)

    def _leave(self, module: nn.Module, args: Any, output: Any) -> None:
        if self.running:
            self.running.pop()

    def describe(self) -> str:
        """``layers.0.mlp.experts (MixtralExperts)``, or the root's class when no submodule was running."""
        name = self.running[-1] if self.running else ""
        return f"{name or 'the model'} ({type(self.module.get_submodule(name)).__name__})"


@contextmanager
def _no_stack_traces() -> Iterator[None]:
    """Skip recording a Python stack trace per node: the module stack tracer would, at a cost per node."""
    saved = fx_config.do_not_emit_stack_traces
    fx_config.do_not_emit_stack_traces = True
    try:
        yield
    finally:
        fx_config.do_not_emit_stack_traces = saved


def _lift_constants(gm: fx.GraphModule, n_params: int, buffers: Mapping[str, Any]) -> dict[str, Any]:
    """Turn each tensor constant of ``gm`` (a ``get_attr`` node: make_fx keeps tensors made from Python
    data as attributes) into a placeholder after the buffers', taken from the buffers dict under the
    attribute's name; returns name -> fake value. The planner then sees a constant as it sees a buffer,
    and the ``lift_fresh_copy`` that read it becomes the ``clone`` it stands for (one op fewer to know)."""
    found = [n for n in gm.graph.nodes if n.op == "get_attr" and isinstance(n.meta.get("val"), torch.Tensor)]
    if not found:
        return {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    later = placeholders[n_params + len(buffers) :]  # the inputs'
    anchor = later[0] if later else next(n for n in gm.graph.nodes if n.op != "placeholder")
    constants: dict[str, Any] = {}
    lifted: dict[str, fx.Node] = {}
    for node in found:  # one placeholder per attribute, which several get_attr nodes may read
        name = str(node.target)
        if name not in lifted:
            with gm.graph.inserting_before(anchor):
                lifted[name] = gm.graph.placeholder(name)
            lifted[name].meta = dict(node.meta)
            constants[name] = node.meta["val"]
        for user in list(node.users):
            if user.target is torch.ops.aten.lift_fresh_copy.default:
                user.target = torch.ops.aten.clone.default
        node.replace_all_uses_with(lifted[name])
        gm.graph.erase_node(node)
    codegen = gm.graph._codegen
    args = tree_unflatten(placeholders, codegen.pytree_info.in_spec)
    args[1].update(constants)  # the buffers dict of step(params, buffers, *tensors)
    codegen.pytree_info = codegen.pytree_info._replace(in_spec=tree_flatten(args)[1])
    gm.recompile()
    return constants


# ------------------------------------------------------------------------------------- backward tagging


def _tag_backward_ops(loss: torch.Tensor) -> None:
    """Hook every autograd node behind ``loss`` so that the ops its backward emits are traced with
    ``meta["seq_nr"]`` of the forward op that made the node and ``meta["autograd_backward"] = True``."""
    seen: set[Any] = set()
    stack = [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        node.register_prehook(functools.partial(_enter_backward, node._sequence_nr()))
        node.register_hook(_leave_backward)
        stack.extend(next_node for next_node, _ in node.next_functions)


def _enter_backward(seq_nr: int, grad_outputs: Any) -> None:
    fx_traceback.set_grad_fn_seq_nr(seq_nr)
    fx_traceback._mark_autograd_backward()


def _leave_backward(grad_inputs: Any, grad_outputs: Any) -> None:
    fx_traceback.reset_grad_fn_seq_nr()
    fx_traceback._reset_autograd_backward()


# ------------------------------------------------------------------------------------------------ roles


def _roles(
    gm: fx.GraphModule, module: nn.Module, params: dict, buffers: dict, inputs: list[torch.Tensor]
) -> JointGraph:
    """Name the placeholders, the loss and the gradients of a graph traced by :func:`capture_step`."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    n_params, n_buffers = len(params), len(buffers)
    trainable = [name for name, p in params.items() if p.requires_grad]
    wrt_inputs = [i for i, x in enumerate(inputs) if x.requires_grad]
    return JointGraph(
        gm=gm,
        parameters=dict(zip(params, placeholders[:n_params], strict=True)),
        tied=_tied_names(module),
        buffers=dict(zip(buffers, placeholders[n_params : n_params + n_buffers], strict=True)),
        inputs=placeholders[n_params + n_buffers :],
        **_outputs_and_order(gm, trainable, wrt_inputs),
    )


def _outputs_and_order(gm: fx.GraphModule, trainable: list[str], wrt_inputs: list[int]) -> dict[str, Any]:
    """The JointGraph fields read from the output node and the op nodes: loss, gradients, order, paths."""
    loss, *grads = gm.graph.output_node().args[0]  # flat: make_fx keeps the nesting in gm._out_spec
    order = [n for n in gm.graph.nodes if n.op == "call_function"]
    backward_start = _backward_start(order, loss)
    return {
        "loss": loss,
        "gradients": dict(zip(trainable, grads[: len(trainable)], strict=True)),
        "input_gradients": dict(zip(wrt_inputs, grads[len(trainable) :], strict=True)),
        "order": order,
        "backward_start": backward_start,
        "module_path": _module_paths(order, backward_start),
    }


def _backward_start(order: list[fx.Node], loss: fx.Node) -> int:
    """Index of the first backward op: the first after the loss that is not another output of a forward op
    (``nll_loss_forward``'s total weight). Other forward values made after the loss are dead: removed."""
    if loss not in order:
        return 0
    start = order.index(loss) + 1
    forward = set(order[:start])
    while start < len(order) and order[start].target is operator.getitem and order[start].args[0] in forward:
        forward.add(order[start])
        start += 1
    return start


def _tied_names(module: nn.Module) -> dict[str, list[str]]:
    """First name -> other names, for every parameter object reachable under more than one name."""
    names: dict[int, list[str]] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    return {group[0]: group[1:] for group in names.values() if len(group) > 1}


def _module_paths(order: list[fx.Node], backward_start: int) -> dict[str, str]:
    """Node name -> innermost module path; see the module docstring for how backward ops get theirs."""
    paths: dict[str, str] = {}
    forward_by_seq: dict[Any, str | None] = {}
    for index, node in enumerate(order):
        if "nn_module_stack" not in node.meta and "seq_nr" not in node.meta:  # made by a graph pass
            path = _common_path([paths.get(arg.name) for arg in node.all_input_nodes])
        elif index < backward_start:
            path = _innermost(node.meta.get("nn_module_stack"))
            forward_by_seq.setdefault(node.meta.get("seq_nr"), path)
        elif node.meta.get("autograd_backward"):
            path = forward_by_seq.get(node.meta.get("seq_nr"))
        else:
            path = _common_path([paths.get(arg.name) for arg in node.all_input_nodes])
        if path is not None:
            paths[node.name] = path
    return paths


def _innermost(stack: Mapping[str, tuple[str, Any]] | None) -> str | None:
    """The innermost module's qualified name in an ``nn_module_stack``; None outside the module."""
    if not stack:
        return None
    return next(reversed(stack.values()))[0]


def _common_path(paths: list[str | None]) -> str | None:
    """The longest common dotted prefix of the known paths (``layers.3.a``, ``layers.3.b``: ``layers.3``)."""
    known = [p.split(".") if p else [] for p in paths if p is not None]
    if not known:
        return None
    common = known[0]
    for parts in known[1:]:
        n = 0
        while n < min(len(common), len(parts)) and common[n] == parts[n]:
            n += 1
        common = common[:n]
    return ".".join(common)


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
