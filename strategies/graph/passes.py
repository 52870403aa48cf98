"""Rewrites of a captured joint graph that let the planner see more ways to shard it.

:func:`expose_sequence_dims` undoes the flattening make_fx puts around every ``F.linear`` on a
``[B, S, ..., K]`` input. A flattening view ``[B, S, K] -> [B*S, K]`` lets only its outermost dim stay
sharded, so a shard of ``S`` (sequence or context parallelism) could never reach a matmul. Each chain
below, as the real joint graphs of ``nn.Linear`` and the Llama block have it, becomes one
``autoshard::einsum`` (:mod:`strategies.ops.einsum_ops`) over the unflattened tensors; ``bs`` stands for
the leading dims (``bsh`` with three, and so on), ``k`` for the contracted dim and ``n`` for the free one:

=====================  ===========================================================  ========================
chain                  captured form                                                rewritten as
=====================  ===========================================================  ========================
forward, grad input    ``view(mm(view(x, [B*S, K]), w), [B, S, N])``                ``"bsk,kn->bsn"``
forward with bias      ``view(addmm(bias, view(x, [B*S, K]), w), [B, S, N])``       ``"bsk,kn->bsn"`` + add
grad weight            ``mm(t(view(x, [B*S, K])), view(g, [B*S, N]))``              ``"bsk,bsn->kn"``
grad bias              ``sum(view(g, [B*S, N]), [0], keepdim)``                     ``sum(g, [0, 1])``
=====================  ===========================================================  ========================

:func:`exact_mean_losses` turns every mean ``nll_loss_forward`` into its sum over its total weight, so a
batch-sharded loss stays exact when some targets are ``ignore_index``.

Letters are positional: in the captured graphs the weight gradient is ``t(view(g)) @ view(x)`` (``[N, K]``,
transposed afterwards), so its einsum reads ``"bsk,bsn->kn"`` with ``k`` the output features. The forward
and the grad-input matmul have one form (a flattened activation times a 2-D matrix: ``w`` is
``t(weight)`` forward and ``t(t(weight))`` backward), so they get one equation. The view back may
split ``N`` further (``[B, S, H, D]``): the einsum's ``[B, S, N]`` result is then viewed to it. A chain is
rewritten only when it matches exactly, shapes checked on ``node.meta["val"]``: the flattened tensor has
shape ``[*lead, *rest]`` with at least two leading dims (several trailing dims, as a ``[B, S, H, D]``
gradient flattened to ``[B*S, H*D]``, are merged by one ``[B, S, H*D]`` view) and every user of the
matmul views it back to ``[*lead, ...]``. Every other node is kept; nodes the rewrite leaves unused are
removed.

:func:`capture_for_planning` runs, before these, :func:`strategies.graph.experts.explicit_expert_groups`:
the experts' grouped products with their group starts made explicit, so experts can be sharded.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch.fx import Graph, GraphModule, Node

from strategies.graph.rewrite import new_call
from strategies.ops.einsum_ops import EINSUM

if TYPE_CHECKING:
    from strategies.graph.capture import JointGraph

aten = torch.ops.aten
_getitem = operator.getitem

VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)
"""Ops that flatten a tensor in the captured chains (``_unsafe_view`` follows a copy, same meaning)."""
TRANSPOSES = (aten.t.default, aten.transpose.int, aten.permute.default)
REMOVABLE = (*VIEWS, *TRANSPOSES, aten.mm.default, aten.addmm.default, aten.sum.dim_IntList)
"""Ops the pass may erase once the rewrite leaves them without users (pure, no side effect)."""
LEAD_LETTERS = "bshgij"
"""Letters of the leading dims in the equations: batch, sequence, then any further dims."""
MERGING_VIEW = "autoshard_merging_view"
"""Meta tag of the views the pass adds to merge trailing dims, until duplicates are merged (then removed)."""


def capture_for_planning(
    module: torch.nn.Module, inputs: Any, loss_fn: Any = None, compute_dtype: torch.dtype | None = None
) -> JointGraph:
    """One training step captured (:func:`~strategies.graph.capture.capture_step`, ``compute_dtype`` for
    mixed precision) and rewritten by the passes the planner plans on: the graph a plan names, node for
    node."""
    from strategies.graph.capture import capture_step
    from strategies.graph.experts import explicit_expert_groups

    graph = capture_step(module, inputs, loss_fn, compute_dtype)
    explicit_expert_groups(graph.gm)
    expose_sequence_dims(graph.gm)
    exact_mean_losses(graph.gm)
    graph.refresh()
    return graph


def expose_sequence_dims(gm: GraphModule) -> int:
    """Rewrite, in place, every flattened matmul chain of ``gm`` into ``autoshard::einsum`` (table above).

    Returns how many ``mm``/``addmm`` nodes were rewritten; grad-bias sums are rewritten too but not
    counted. Call it on a captured joint graph (:func:`strategies.graph.capture.capture_joint`) before
    building the problem.
    """
    graph = gm.graph
    rewritten = 0
    for node in list(graph.nodes):
        if _is_call(node, (aten.mm.default, aten.addmm.default)) and (
            _rewrite_weight_grad(graph, node) or _rewrite_activation_matmul(graph, node)
        ):
            rewritten += 1
    for node in list(graph.nodes):
        if _is_call(node, (aten.sum.dim_IntList,)):
            _rewrite_bias_grad(graph, node)
    _merge_duplicate_views(graph)
    graph.lint()
    gm.recompile()
    return rewritten


NLL_MEAN, NLL_SUM = 1, 2
"""``reduction`` codes of ``aten.nll_loss_forward`` (ATen's ``Reduction`` enum)."""


def exact_mean_losses(gm: GraphModule) -> int:
    """Rewrite, in place, every ``nll_loss_forward(..., reduction=mean)`` as ``sum / total_weight``.

    With the batch sharded, a mean loss is DTensor's ``P(avg)`` of per-shard means: exact only when every
    shard holds as many counted targets, which padding labels (``ignore_index``, -100 in Hugging Face
    models) break. The sum and the total weight are exact partial sums (``P``), so after the rewrite every
    batch-sharded plan computes the true mean: ``div(loss_sum, total_weight)`` once ``total_weight`` is
    reduced. The backward already divides by the forward's ``total_weight`` (which it must read whole), so
    it is left as it is. Returns how many losses were rewritten.
    """
    graph = gm.graph
    rewritten = 0
    for node in list(graph.nodes):
        if not _is_call(node, (aten.nll_loss_forward.default,)) or _reduction(node) != NLL_MEAN:
            continue
        outputs = {user.args[1]: user for user in node.users if user.target is _getitem}
        if len(outputs) != len(node.users):
            continue  # an output read other than through getitem: leave it
        with graph.inserting_after(node):
            args = (*node.args[:3], NLL_SUM, *node.args[4:])
            summed = new_call(graph, aten.nll_loss_forward.default, args, like=node)
        with graph.inserting_after(summed):
            total = graph.call_function(_getitem, (summed, 1))
            total.meta["val"] = summed.meta["val"][1]
        with graph.inserting_after(total):
            loss_sum = graph.call_function(_getitem, (summed, 0))
            loss_sum.meta["val"] = summed.meta["val"][0]
        with graph.inserting_after(loss_sum):
            mean = new_call(graph, aten.div.Tensor, (loss_sum, total), like=node)
        if 0 in outputs:
            outputs[0].replace_all_uses_with(mean)
            graph.erase_node(outputs[0])
        if 1 in outputs:
            outputs[1].replace_all_uses_with(total)
            graph.erase_node(outputs[1])
        graph.erase_node(node)
        rewritten += 1
    graph.lint()
    gm.recompile()
    return rewritten


def _reduction(node: Node) -> int:
    return int(node.args[3]) if len(node.args) > 3 else int(node.kwargs.get("reduction", NLL_MEAN))


# ---------------------------------------------------------------------------------------- matching


@dataclass(frozen=True)
class Flattened:
    """``view(source, [prod(lead), width])``; ``source`` is ``[*lead, *rest]``, ``prod(rest) == width``."""

    source: Node
    lead: tuple[int, ...]
    width: int


def _is_call(node: Any, targets: Sequence[Any]) -> bool:
    return (
        isinstance(node, Node)
        and node.op == "call_function"
        and node.target in targets
        and not getattr(node, "_erased", False)
    )


def _shape(node: Any) -> tuple[int, ...] | None:
    """The static shape of a node's tensor value, ``None`` for anything else (or symbolic sizes)."""
    val = node.meta.get("val") if isinstance(node, Node) else None
    if not isinstance(val, torch.Tensor) or not all(isinstance(s, int) for s in val.shape):
        return None
    return tuple(val.shape)


def _dtype(node: Node) -> torch.dtype | None:
    val = node.meta.get("val")
    return val.dtype if isinstance(val, torch.Tensor) else None


def flattened(node: Any) -> Flattened | None:
    """The :class:`Flattened` a view node is, or ``None`` when it is another view (or not one).

    ``lead`` is the shortest prefix of at least two dims whose sizes multiply to the flattened rows:
    ``[B, S, K] -> [B*S, K]`` has lead ``(B, S)``, and so has ``[B, S, H, D] -> [B*S, H*D]``.
    """
    if not _is_call(node, VIEWS) or not isinstance(node.args[0], Node):
        return None
    source_shape, shape = _shape(node.args[0]), _shape(node)
    if source_shape is None or shape is None or len(shape) != 2:
        return None
    for split in range(2, min(len(source_shape), len(LEAD_LETTERS)) + 1):
        if math.prod(source_shape[:split]) == shape[0] and split < len(source_shape):
            return Flattened(node.args[0], source_shape[:split], shape[1])
    return None


def _unflattened(graph: Graph, flat: Flattened, like: Node) -> Node:
    """``flat.source`` as ``[*lead, width]``: itself, or a view merging its trailing dims."""
    target = [*flat.lead, flat.width]
    if _shape(flat.source) == tuple(target):
        return flat.source
    view = new_call(graph, aten.view.default, (flat.source, target), like=like)
    view.meta[MERGING_VIEW] = True
    return view


def _merge_duplicate_views(graph: Graph) -> None:
    """Keep one of the trailing-merge views the pass added per (source, shape): the first in graph order,
    which precedes every user of the later ones."""
    first: dict[tuple[Node, tuple[int, ...]], Node] = {}
    for node in list(graph.nodes):
        if not node.meta.pop(MERGING_VIEW, False):
            continue
        key = (node.args[0], tuple(node.args[1]))
        if key in first:
            node.replace_all_uses_with(first[key])
            graph.erase_node(node)
        else:
            first[key] = node


def _transposed_2d(node: Any) -> Node | None:
    """``x`` when ``node`` is ``t(x)``, ``transpose(x, 0, 1)`` or ``permute(x, [1, 0])`` of a 2-D ``x``."""
    if not _is_call(node, TRANSPOSES) or len(_shape(node.args[0]) or ()) != 2:
        return None
    if node.target == aten.transpose.int and sorted(d % 2 for d in node.args[1:3]) != [0, 1]:
        return None
    if node.target == aten.permute.default and [d % 2 for d in node.args[1]] != [1, 0]:
        return None
    return node.args[0]


def _views_back(user: Node, matmul: Node, lead: tuple[int, ...]) -> bool:
    """``user`` views ``matmul``'s ``[prod(lead), N]`` result to ``[*lead, ...]``."""
    shape, flat = _shape(user), _shape(matmul)
    return (
        _is_call(user, VIEWS)
        and user.args[0] is matmul
        and shape is not None
        and flat is not None
        and len(shape) > len(lead)
        and shape[: len(lead)] == lead
        and math.prod(shape[len(lead) :]) == flat[1]
    )


def _default_scales(node: Node) -> bool:
    """``addmm``'s ``beta`` and ``alpha`` are 1 (``bias + mat1 @ mat2``)."""
    beta = node.args[3] if len(node.args) > 3 else node.kwargs.get("beta", 1)
    alpha = node.args[4] if len(node.args) > 4 else node.kwargs.get("alpha", 1)
    return beta == 1 and alpha == 1


# --------------------------------------------------------------------------------------- rewriting


def _rewrite_activation_matmul(graph: Graph, matmul: Node) -> bool:
    """``view(mm(view(x, [B*S, K]), w), [B, S, ...])`` -> ``einsum("bsk,kn->bsn", x, w)`` (+ ``bias``)."""
    if matmul.target == aten.addmm.default:
        bias, lhs, rhs = matmul.args[:3]
        n = (_shape(matmul) or (0, 0))[1]
        if not _default_scales(matmul) or _shape(bias) != (n,) or _dtype(bias) != _dtype(matmul):
            return False
    else:
        (lhs, rhs), bias = matmul.args, None
    flat = flattened(lhs)
    users = list(matmul.users)
    if flat is None or len(_shape(rhs) or ()) != 2 or not users:
        return False
    if not all(_views_back(user, matmul, flat.lead) for user in users):
        return False
    lead = LEAD_LETTERS[: len(flat.lead)]
    with graph.inserting_before(matmul):
        source = _unflattened(graph, flat, like=matmul)
        out = new_call(graph, EINSUM, (f"{lead}k,kn->{lead}n", source, rhs), like=matmul)
        if bias is not None:
            out = new_call(graph, aten.add.Tensor, (out, bias), like=matmul)
    for user in users:
        _replace(graph, user, out)
    graph.erase_node(matmul)
    _erase_if_dead(graph, lhs)
    return True


def _rewrite_weight_grad(graph: Graph, matmul: Node) -> bool:
    """``mm(t(view(x, [B*S, K])), view(g, [B*S, N]))`` -> ``einsum("bsk,bsn->kn", x, g)``."""
    if matmul.target != aten.mm.default:
        return False
    lhs, rhs = matmul.args
    inner = _transposed_2d(lhs)
    left, right = flattened(inner), flattened(rhs)
    if left is None or right is None or left.lead != right.lead:
        return False
    lead = LEAD_LETTERS[: len(left.lead)]
    with graph.inserting_before(matmul):
        sources = _unflattened(graph, left, like=matmul), _unflattened(graph, right, like=matmul)
        out = new_call(graph, EINSUM, (f"{lead}k,{lead}n->kn", *sources), like=matmul)
    matmul.replace_all_uses_with(out)
    graph.erase_node(matmul)
    _erase_if_dead(graph, lhs)
    _erase_if_dead(graph, rhs)
    return True


def _rewrite_bias_grad(graph: Graph, total: Node) -> bool:
    """``sum(view(g, [B*S, N]), [0], keepdim)`` -> ``sum(g, [0, 1])`` (viewed to ``[1, N]`` if a user
    needs the kept dim; a user that views it to ``[N]`` takes the new sum directly)."""
    source, dims = total.args[0], total.args[1]
    keepdim = total.args[2] if len(total.args) > 2 else total.kwargs.get("keepdim", False)
    flat = flattened(source)
    if flat is None or total.kwargs.get("dtype") is not None or [d % 2 for d in dims] != [0]:
        return False
    with graph.inserting_before(total):
        grad = _unflattened(graph, flat, like=total)
        out = new_call(graph, aten.sum.dim_IntList, (grad, list(range(len(flat.lead)))), like=total)
    if keepdim:
        for user in list(total.users):
            if _is_call(user, VIEWS) and _shape(user) == _shape(out):
                user.replace_all_uses_with(out)
                graph.erase_node(user)
    _replace(graph, total, out)
    _erase_if_dead(graph, source)
    return True


def _replace(graph: Graph, old: Node, new: Node) -> None:
    """Point every user of ``old`` at ``new`` (viewed to ``old``'s shape where it differs); erase ``old``."""
    if old.users and _shape(old) != _shape(new):
        with graph.inserting_before(old):
            new = new_call(graph, aten.view.default, (new, list(_shape(old) or ())), like=old)
    old.replace_all_uses_with(new)
    graph.erase_node(old)


def _erase_if_dead(graph: Graph, node: Any) -> None:
    """Erase a pure node the rewrite left without users, then its inputs that became unused too."""
    if not _is_call(node, REMOVABLE) or node.users:
        return
    inputs = [a for a in node.all_input_nodes]
    graph.erase_node(node)
    for arg in inputs:
        _erase_if_dead(graph, arg)
