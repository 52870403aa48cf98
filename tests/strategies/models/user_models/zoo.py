"""Tiny ``transformers`` models of the architectures people train, left in training mode (dropout on).

Each function is a ``path/file.py:function`` factory for `autoshard plan` and `autoshard run`: it builds its
model on the CPU from the same seed and returns ``(module, example_inputs)``, keyword arguments with
``labels`` so Hugging Face's ``.loss`` is the step's loss. Two layers each (one encoder and one decoder
layer for the encoder-decoder), widths divisible by 4 so every mesh of up to four devices can cut them.
"""

from __future__ import annotations

from typing import Any

import torch
import transformers

BATCH, SEQ, VOCAB, WIDTH, HEADS = 4, 16, 256, 64, 4

Built = tuple[torch.nn.Module, dict[str, torch.Tensor]]


def _decoder(config_class: str, model_class: str = "", **fields: Any) -> Built:
    """A causal language model of ``config_class`` with the common tiny sizes and ``fields`` on top."""
    sizes: dict[str, Any] = {
        "vocab_size": VOCAB,
        "hidden_size": WIDTH,
        "intermediate_size": 2 * WIDTH,
        "num_hidden_layers": 2,
        "num_attention_heads": HEADS,
        "max_position_embeddings": 4 * SEQ,
        "attn_implementation": "sdpa",
        "pad_token_id": 0,
        "bos_token_id": 0,
        "eos_token_id": 0,
    }
    config = getattr(transformers, config_class)(**{**sizes, **fields})
    torch.manual_seed(0)
    model_name = model_class or config_class.replace("Config", "ForCausalLM")
    module = getattr(transformers, model_name)(config)
    module.train()
    tokens = torch.randint(VOCAB, (BATCH, SEQ))
    return module, {"input_ids": tokens, "labels": tokens}


def gpt2() -> Built:
    return _decoder(
        "GPT2Config",
        "GPT2LMHeadModel",
        n_embd=WIDTH,
        n_layer=2,
        n_head=HEADS,
        n_positions=4 * SEQ,
    )


def llama() -> Built:
    return _decoder("LlamaConfig", num_key_value_heads=2)


def mistral_sliding_window() -> Built:
    return _decoder("MistralConfig", num_key_value_heads=2, sliding_window=SEQ // 2)


def qwen2() -> Built:
    return _decoder("Qwen2Config", num_key_value_heads=2)


def gpt_neox() -> Built:
    return _decoder("GPTNeoXConfig", hidden_dropout=0.1, attention_dropout=0.1)


def gemma() -> Built:
    return _decoder("GemmaConfig", num_key_value_heads=2, head_dim=WIDTH // HEADS)


def gemma2() -> Built:
    return _decoder(  # transformers runs Gemma 2's soft-capped attention only eagerly
        "Gemma2Config",
        num_key_value_heads=2,
        head_dim=WIDTH // HEADS,
        sliding_window=SEQ // 2,
        attn_implementation="eager",
    )


def phi3() -> Built:
    return _decoder("Phi3Config", num_key_value_heads=HEADS)


def mixtral() -> Built:
    return _decoder("MixtralConfig", num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2)


def qwen2_moe() -> Built:
    return _decoder(
        "Qwen2MoeConfig",
        num_key_value_heads=2,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=WIDTH,
        shared_expert_intermediate_size=WIDTH,
    )


def bert() -> Built:
    config = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=WIDTH,
        intermediate_size=2 * WIDTH,
        num_hidden_layers=2,
        num_attention_heads=HEADS,
        max_position_embeddings=4 * SEQ,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    module = transformers.BertForMaskedLM(config)
    module.train()
    tokens = torch.randint(VOCAB, (BATCH, SEQ))
    return module, {"input_ids": tokens, "labels": tokens}


def t5(dropout_rate: float = 0.1) -> Built:
    """One encoder and one decoder layer; ``_shift_right`` writes the decoder's start token with
    ``aten.fill_.Tensor``, an op DTensor has no rule for."""
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
        dropout_rate=dropout_rate,
    )
    torch.manual_seed(0)
    module = transformers.T5ForConditionalGeneration(config)
    module.train()
    tokens = torch.randint(1, VOCAB, (BATCH, SEQ))
    return module, {"input_ids": tokens, "labels": torch.randint(1, VOCAB, (BATCH, SEQ // 2))}


def vit() -> Built:
    config = transformers.ViTConfig(
        image_size=32,
        patch_size=8,
        hidden_size=WIDTH,
        intermediate_size=2 * WIDTH,
        num_hidden_layers=2,
        num_attention_heads=HEADS,
        num_labels=8,
        hidden_dropout_prob=0.1,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    module = transformers.ViTForImageClassification(config)
    module.train()
    return module, {"pixel_values": torch.randn(BATCH, 3, 32, 32), "labels": torch.randint(8, (BATCH,))}


ARCHITECTURES = (
    "gpt2",
    "llama",
    "mistral_sliding_window",
    "qwen2",
    "gpt_neox",
    "gemma",
    "gemma2",
    "phi3",
    "mixtral",
    "qwen2_moe",
    "bert",
    "t5",
    "vit",
)
