"""Mixed precision in the captured step (``capture_step(..., compute_dtype=...)``): the parameters keep their
dtype, the step computes on copies made just before their first reader, in their parameter's module, and
each gradient goes back to the parameter's dtype as soon as it is made."""

from __future__ import annotations

import torch

from strategies.graph.passes import capture_for_planning
from strategies.models.builder import build_model

LLAMA = {"dim": 64, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 256, "ffn_dim": 128, "max_seq_len": 64}
TO_COPY = torch.ops.aten._to_copy.default


def llama(compute_dtype: torch.dtype | None):
    spec = build_model("llama3-8b", batch=2, seq=16, dtype=torch.float32, device="meta", layers=2, **LLAMA)
    return capture_for_planning(spec.module, spec.example_inputs, spec.loss_fn, compute_dtype)


def test_each_parameter_is_copied_in_the_compute_dtype_just_before_its_first_reader() -> None:
    graph = llama(torch.bfloat16)
    position = {node: index for index, node in enumerate(graph.order)}
    for name, placeholder in graph.parameters.items():
        (copy,) = [user for user in placeholder.users if user.target is TO_COPY]
        assert copy.kwargs["dtype"] is torch.bfloat16 and copy.meta["val"].dtype is torch.bfloat16
        assert placeholder.meta["val"].dtype is torch.float32
        first = min(position[user] for user in copy.users)
        assert position[copy] == first - 1  # made for its first reader, not at the step's start
        assert graph.module_path[copy.name] == name.rpartition(".")[0]  # in its layer: tied, repeated


def test_each_gradient_is_in_the_parameters_dtype_as_soon_as_it_is_made() -> None:
    graph = llama(torch.bfloat16)
    position = {node: index for index, node in enumerate(graph.order)}
    for name, gradient in graph.gradients.items():
        assert gradient.meta["val"].dtype is torch.float32, name
        if gradient.target is TO_COPY:  # made in bf16, cast back right after
            assert position[gradient] == position[gradient.args[0]] + 1


def test_without_a_compute_dtype_the_step_has_no_copies() -> None:
    plain = llama(None)
    assert not [n for n in plain.order if n.target is TO_COPY and n.args[0] in plain.parameters.values()]
    assert len(llama(torch.bfloat16).order) > len(plain.order)
