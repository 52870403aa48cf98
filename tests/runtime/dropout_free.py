"""Tiny ``transformers`` models of the zoo (``tests/strategies/models/user_models/zoo.py``) with dropout 0:
factories (``path/file.py:function``) for the tests of ops and placements that must not depend on random
masks (sharded dropout is tested on its own)."""

from __future__ import annotations

import torch
import transformers

BATCH, SEQ, VOCAB, WIDTH, HEADS = 4, 16, 256, 64, 4


def t5() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """The zoo's T5 (one encoder and one decoder layer) without dropout; its ``_shift_right`` writes the
    decoder's start token with ``aten.fill_.Tensor``, an op DTensor has no rule for."""
    config = transformers.T5Config(
        vocab_size=VOCAB,
        d_model=WIDTH,
        d_kv=WIDTH // HEADS,
        d_ff=2 * WIDTH,
        num_layers=1,
        num_decoder_layers=1,
        num_heads=HEADS,
        decoder_start_token_id=0,
        pad_token_id=0,
        dropout_rate=0.0,
    )
    torch.manual_seed(0)
    module = transformers.T5ForConditionalGeneration(config)
    module.train()
    tokens = torch.randint(1, VOCAB, (BATCH, SEQ))
    return module, {"input_ids": tokens, "labels": torch.randint(1, VOCAB, (BATCH, SEQ // 2))}
