"""GPT-2 built from a ``transformers`` config: tiny, with tied input and output embeddings.

``factory()`` returns ``(module, example_inputs)``: the inputs are keyword arguments with ``labels``, so the
output carries Hugging Face's ``.loss`` and the planner takes that as the step's loss. The model is built on
the CPU (it is tiny: tests run it for real) and left as a user leaves it: in training mode (dropout on), with
``use_cache`` on (the KV cache starts from empty tensors made in ``forward``: constants of the graph).
"""

from __future__ import annotations

import torch
from transformers import GPT2Config, GPT2LMHeadModel

BATCH, SEQ = 4, 32


def factory() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    config = GPT2Config(
        vocab_size=1000,
        n_positions=128,
        n_embd=64,
        n_layer=2,
        n_head=4,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=0,
        # transformers' default ("eager" captures too); with attention dropout in training, CPU SDPA takes
        # its math path: traced as bmm and softmax
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    tokens = torch.randint(config.vocab_size, (BATCH, SEQ))
    return model, {"input_ids": tokens, "labels": tokens}
