"""Llama built from a ``transformers`` config: tiny, with grouped-query attention (2 key/value heads shared
by 4 query heads).

``factory()`` returns ``(module, example_inputs)``: the inputs are keyword arguments with ``labels``, so the
output carries Hugging Face's ``.loss`` and the planner takes that as the step's loss.
"""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

BATCH, SEQ = 4, 32


def factory() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    config = LlamaConfig(
        vocab_size=1000,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        bos_token_id=0,
        eos_token_id=1,
        # transformers' default ("eager" captures too); traced as CPU flash attention, one op forward
        # and one backward (fake tensors are CPU tensors)
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    tokens = torch.randint(config.vocab_size, (BATCH, SEQ))
    return model, {"input_ids": tokens, "labels": tokens}


def factory_on_meta() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """The same model and inputs on the meta device: no memory, as a model too big for the host is given."""
    with torch.device("meta"):
        return factory()
