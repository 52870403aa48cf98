"""Mixtral built from a ``transformers`` config with many experts for its width: 16 experts, 2 per token.

Expert weights (``16 x 256 x 64`` per layer) outweigh the tokens they see (``4 x 16`` tokens x 2 choices),
the regime where expert parallelism pays: on the ``cpu`` hardware preset the planner then runs the gate-up
product on each rank's own experts and sums the results, rather than gathering every expert's weights.
``factory()`` returns ``(module, example_inputs)``, keyword arguments with ``labels`` (Hugging Face's
``.loss`` is the step's loss); grouped-mm experts, transformers' default.
"""

from __future__ import annotations

import torch
from transformers import MixtralConfig, MixtralForCausalLM

BATCH, SEQ, EXPERTS = 4, 16, 16


def factory() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    config = MixtralConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=EXPERTS,
        num_experts_per_tok=2,
        max_position_embeddings=64,
        attn_implementation="sdpa",
        pad_token_id=0,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(0)
    model = MixtralForCausalLM(config)
    model.train()
    tokens = torch.randint(config.vocab_size, (BATCH, SEQ))
    return model, {"input_ids": tokens, "labels": tokens}
