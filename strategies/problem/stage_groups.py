"""Where each op of a captured step sits in the stack of layers: what a pipeline's stages are cut by.

An op inside a layer (``layers.<i>``, ``h.<i>``, ... in its module path:
:data:`strategies.problem.layer_sharing.LAYER`) belongs to that layer; so does an op outside every
layer's module that reads a layer's values and runs among the layers or has no module at all (a gradient
accumulation, a cast, a residual add in the root module's code): the earliest layer it reads in the backward
(the residual stream's gradient is the next layer down's input), the last in the forward. Any other op
belongs to the first stage when it runs before every layer's forward or after every layer's backward (the
embedding and its gradient), else to the last (the final norm, the output head, the loss and their
gradients). A ``getitem`` goes with the op whose output it reads. The planner prices stages by these groups
(:mod:`strategies.plan.stages`) and the runtime runs them (:mod:`runtime.pipeline_step`): one definition.

A zero-bubble schedule splits each backward in two (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR
2024): the part making the gradients other layers wait for (``B``: the activations' gradients, handed down
the stack) and the part making only parameters' gradients (``W``), run later to fill the bubble.
:func:`weight_gradient_ops` says which backward ops are ``W``: those none of whose results reaches an op of
another group, directly or through other backward ops. No ``B`` op reads a ``W`` op's result, so the ``B``
part runs first and alone; everything sent back over a cut (read by an earlier group) is ``B``'s.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence

import torch

from strategies.problem.layer_sharing import LAYER_STACKS, layer_of

FIRST, LAST = "first", "last"
Group = int | str
"""A layer of the captured stack, or `FIRST` / `LAST`."""


def stage_paths(order: Sequence[torch.fx.Node], module_path: Mapping[str, str]) -> dict[str, str]:
    """Module paths for cutting the model into stages: a node's own path where it has one, inside a layer or
    not (the output head and the final norm stay outside every layer, where the layer ties give them the last
    layer's), else its first argument's (the loss after the head, autograd's casts)."""
    paths: dict[str, str] = {}
    for node in order:
        own = module_path.get(node.name, "")
        if own:
            paths[node.name] = own
            continue
        source = next((s for s in node.all_input_nodes if paths.get(s.name)), None)
        if source is not None:
            paths[node.name] = paths[source.name]
    return paths


def op_groups(
    order: Sequence[torch.fx.Node], module_path: Mapping[str, str], backward_start: int
) -> dict[str, Group]:
    """Each op node's group by name (module docstring); ``order[:backward_start]`` is the forward."""
    own = [layer_of(module_path.get(node.name, "")) for node in order]
    forward = [i for i, layer in enumerate(own) if layer is not None and i < backward_start]
    backward = [i for i, layer in enumerate(own) if layer is not None and i >= backward_start]
    if not forward or not backward:
        raise ValueError(
            "pipeline: the step has no ops inside numbered layers (a module list named "
            f"{', '.join(LAYER_STACKS)}: `layers.<i>`) to cut into stages"
        )
    first_forward, last_forward = forward[0], forward[-1]
    first_backward, last_backward = backward[0], backward[-1]
    groups: dict[str, Group] = {}
    for i, node in enumerate(order):
        inputs = [groups[s.name] for s in node.all_input_nodes if s.name in groups]
        layered = [group for group in inputs if isinstance(group, int)]
        among = first_forward < i < last_forward or first_backward < i < last_backward
        if node.target is operator.getitem and inputs:
            groups[node.name] = inputs[0]
        elif own[i] is not None:
            groups[node.name] = own[i]  # type: ignore[assignment]
        elif layered and (among or not module_path.get(node.name)):
            # outside every layer's module but among the layers (a gradient accumulation, a cast, the root
            # module's residual add): with the layer it reads, the earliest in the backward (the residual
            # stream's gradient is the next layer down's input), else the last
            groups[node.name] = min(layered) if i >= backward_start else max(layered)
        elif (i < backward_start and i < first_forward) or (i >= backward_start and i > last_backward):
            groups[node.name] = FIRST
        else:
            groups[node.name] = LAST
    return groups


def weight_gradient_ops(
    order: Sequence[torch.fx.Node], backward_start: int, groups: Mapping[str, Group]
) -> set[str]:
    """The backward ops (by name) making only parameters' gradients within their own group (the module
    docstring's ``W``); ``groups``: :func:`op_groups`'s."""
    handed_on: set[str] = set()  # backward ops whose results reach another group
    for node in reversed(order[backward_start:]):
        for user in node.users:
            if user.name in groups and (groups[user.name] != groups[node.name] or user.name in handed_on):
                handed_on.add(node.name)
                break
    return {node.name for node in order[backward_start:] if node.name not in handed_on}


def stage_of_group(group: Group, stages: Sequence[range]) -> int:
    """The stage running a group, ``stages`` being each stage's layers in order."""
    if group == FIRST:
        return 0
    if group == LAST:
        return len(stages) - 1
    for k, layers in enumerate(stages):
        if group in layers:
            return k
    raise ValueError(f"pipeline: layer {group} is in no stage ({', '.join(map(str, stages))})")


def crossed_cuts(producer: int, consumers: Sequence[int]) -> tuple[range, range]:
    """The cuts a value crosses (cut ``c`` lies between stages ``c`` and ``c + 1``), handed on from stage to
    stage as ``torch.distributed.pipelining`` hands a stage's outputs to the next: forward, from the stage
    that makes it to its furthest later reader; backward, to its earliest earlier reader."""
    return range(producer, max(consumers, default=producer)), range(
        min(consumers, default=producer), producer
    )


__all__ = [
    "FIRST",
    "LAST",
    "Group",
    "crossed_cuts",
    "op_groups",
    "stage_of_group",
    "stage_paths",
    "weight_gradient_ops",
]
