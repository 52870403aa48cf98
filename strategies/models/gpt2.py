"""GPT-2, as OpenAI's released model defines it (the Hugging Face ``GPT2LMHeadModel`` layout), for planning.

Pre-norm decoder blocks ``h = x + attn(ln_1(x))``, ``out = h + mlp(ln_2(h))`` with LayerNorm (with bias),
a fused ``c_attn`` projection to queries, keys and values, causal scaled-dot-product attention, a
``c_fc -> GELU(tanh) -> c_proj`` MLP, learned position embeddings, and the output projection ``lm_head``
tied to the token embedding ``wte`` (one parameter under two names). Module names follow Hugging Face
(``wte``, ``wpe``, ``ln_f``, ``lm_head``, ``attn.c_attn``, ``mlp.c_fc``, ...) except that the blocks are
``layers.N`` rather than ``h.N``; projections are ``nn.Linear`` (``[out, in]`` weights), not ``Conv1D``.
Dropout is left out: planning sees the training step of a model run without it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from strategies.models.options import ModelOptionError, check_fields


@dataclass(frozen=True)
class GPT2Config:
    """The shape of a GPT-2 model (defaults: GPT-2 small, 124M parameters)."""

    dim: int = 768
    """Width of the residual stream."""
    n_layers: int = 12
    """Decoder blocks."""
    n_heads: int = 12
    """Attention heads; ``dim / n_heads`` is the head dim."""
    vocab_size: int = 50257
    """Tokens in the vocabulary."""
    max_seq_len: int = 1024
    """Positions with a learned embedding (Hugging Face's ``n_positions``)."""
    ffn_dim: int = 3072
    """Hidden width of the MLP (4 x dim)."""
    norm_eps: float = 1e-5
    """LayerNorm epsilon."""
    tie_embeddings: bool = True
    """Whether ``lm_head`` shares its weight with ``wte``."""

    def __post_init__(self) -> None:
        """Refuse a field of the wrong type or range, then heads that do not split the width evenly (a
        :class:`~strategies.models.options.ModelOptionError` naming the option)."""
        check_fields(self)
        if self.dim % self.n_heads:
            raise ModelOptionError("n_heads", f"dim ({self.dim}) must divide by n_heads ({self.n_heads})")

    def largest_tensors(self, tokens: int) -> dict[str, float]:
        """Element counts of the largest tensors of one training step on ``tokens`` (batch x seq) tokens,
        by what they are: a weight or an activation of each shape that grows with the options."""
        return {
            "the token embedding (vocab_size x dim)": self.vocab_size * self.dim,
            "the position embedding (max_seq_len x dim)": self.max_seq_len * self.dim,
            "the fused attention projection (dim x 3 dim)": 3 * self.dim * self.dim,
            "an MLP weight (dim x ffn_dim)": self.dim * self.ffn_dim,
            "the logits (batch x seq x vocab_size)": tokens * self.vocab_size,
            "the MLP activations (batch x seq x ffn_dim)": tokens * self.ffn_dim,
            "the queries, keys and values (batch x seq x 3 dim)": 3 * tokens * self.dim,
        }

    def replace(self, **changes: int | float | bool) -> GPT2Config:
        return dataclasses.replace(self, **changes)


class Attention(nn.Module):
    """Causal multi-head self-attention with one fused query/key/value projection."""

    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.n_heads = config.n_heads
        self.c_attn = nn.Linear(config.dim, 3 * config.dim)
        self.c_proj = nn.Linear(config.dim, config.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = (
            t.view(b, s, self.n_heads, d // self.n_heads).transpose(1, 2)
            for t in self.c_attn(x).split(d, dim=2)
        )
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(out.transpose(1, 2).reshape(b, s, d))


class MLP(nn.Module):
    """``c_proj(gelu_tanh(c_fc(x)))`` (GPT-2's ``gelu_new``)."""

    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.dim, config.ffn_dim)
        self.c_proj = nn.Linear(config.ffn_dim, config.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    """One decoder layer: pre-norm attention and MLP, each added to the residual stream."""

    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.dim, eps=config.norm_eps)
        self.attn = Attention(config)
        self.ln_2 = nn.LayerNorm(config.dim, eps=config.norm_eps)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attn(self.ln_1(x))
        return h + self.mlp(self.ln_2(h))


class GPT2(nn.Module):
    """Token and position embeddings, ``n_layers`` blocks, final LayerNorm and the tied output projection.

    ``forward(tokens)`` returns logits ``[batch, seq, vocab]``; with ``targets`` (the next tokens) it
    returns the mean cross-entropy loss instead.
    """

    def __init__(self, config: GPT2Config) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.dim)
        self.wpe = nn.Embedding(config.max_seq_len, config.dim)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.ln_f = nn.LayerNorm(config.dim, eps=config.norm_eps)
        self.lm_head = nn.Linear(config.dim, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.wte.weight

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        seq_len = tokens.shape[1]
        if seq_len > self.config.max_seq_len:
            raise ValueError(f"tokens: sequence of {seq_len} exceeds max_seq_len {self.config.max_seq_len}")
        positions = torch.arange(seq_len, device=tokens.device)
        h = self.wte(tokens) + self.wpe(positions)
        for layer in self.layers:
            h = layer(h)
        logits = self.lm_head(self.ln_f(h))
        if targets is None:
            return logits
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(0, 1))
