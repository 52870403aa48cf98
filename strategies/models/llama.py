"""Llama 3, as Meta's reference implementation defines it, for planning on fake tensors.

One pre-norm decoder block: ``h = x + attention(rms_norm(x))``, ``out = h + feed_forward(rms_norm(h))``,
with grouped-query attention (``n_kv_heads`` key/value heads shared by ``n_heads / n_kv_heads`` query
heads each), rotary position embeddings on queries and keys, causal scaled-dot-product attention and a
SwiGLU feed-forward ``w2(silu(w1(x)) * w3(x))``. :class:`Llama` adds the token embedding, ``n_layers``
blocks, a final RMSNorm and the output projection.

Two choices differ in form (not in the function computed) from Meta's code, to keep the captured graph
free of complex tensors, which sharding rules do not cover: RoPE is applied as
``x * cos + rotate_half(x) * sin`` on real tensors (the Hugging Face form; Meta's interleaved complex
form equals it up to a fixed permutation of the ``wq``/``wk`` output rows), and keys/values are repeated
for GQA with ``expand`` + ``reshape`` exactly like Meta's ``repeat_kv``.

Build on the meta device (``with torch.device("meta"): Llama(config)``) to plan without memory.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from strategies.models.options import ModelOptionError, check_fields


@dataclass(frozen=True)
class LlamaConfig:
    """The shape of a Llama 3 model."""

    dim: int = 4096
    """Width of the residual stream."""
    n_layers: int = 32
    """Decoder blocks."""
    n_heads: int = 32
    """Query heads; ``dim / n_heads`` is the head dim."""
    n_kv_heads: int = 8
    """Key/value heads (grouped-query attention); divides ``n_heads``."""
    vocab_size: int = 128256
    """Tokens in the vocabulary."""
    ffn_dim: int = 14336
    """Hidden width of the SwiGLU feed-forward."""
    norm_eps: float = 1e-5
    """RMSNorm epsilon."""
    rope_theta: float = 500000.0
    """RoPE base frequency."""
    max_seq_len: int = 8192
    """Longest sequence the RoPE tables cover."""

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def __post_init__(self) -> None:
        """Refuse a field of the wrong type or range, then heads that do not split the width evenly (a
        :class:`~strategies.models.options.ModelOptionError` naming the option)."""
        check_fields(self)
        if self.dim % self.n_heads:
            raise ModelOptionError("n_heads", f"dim ({self.dim}) must divide by n_heads ({self.n_heads})")
        if self.head_dim % 2:
            raise ModelOptionError(
                "n_heads", f"the head dim dim / n_heads ({self.head_dim}) must be even: RoPE rotates pairs"
            )
        if self.n_heads % self.n_kv_heads:
            raise ModelOptionError(
                "n_kv_heads", f"n_heads ({self.n_heads}) must divide by n_kv_heads ({self.n_kv_heads})"
            )

    def largest_tensors(self, tokens: int) -> dict[str, float]:
        """Element counts of the largest tensors of one training step on ``tokens`` (batch x seq) tokens,
        by what they are: a weight or an activation of each shape that grows with the options."""
        return {
            "the embedding (vocab_size x dim)": self.vocab_size * self.dim,
            "a feed-forward weight (dim x ffn_dim)": self.dim * self.ffn_dim,
            "the RoPE tables (2 x max_seq_len x head_dim)": 2 * self.max_seq_len * self.head_dim,
            "the logits (batch x seq x vocab_size)": tokens * self.vocab_size,
            "the feed-forward activations (batch x seq x ffn_dim)": tokens * self.ffn_dim,
            "the residual stream (batch x seq x dim)": tokens * self.dim,
        }

    def replace(self, **changes: int | float) -> LlamaConfig:
        return dataclasses.replace(self, **changes)


PRESETS: dict[str, LlamaConfig] = {
    "llama3-8b": LlamaConfig(),
    "llama3-70b": LlamaConfig(dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, ffn_dim=28672),
    # Llama 3.1 405B (Meta's params.json: 126 layers, dim 16384, 128 heads, 8 KV heads, FFN 53248)
    "llama3-405b": LlamaConfig(dim=16384, n_layers=126, n_heads=128, n_kv_heads=8, ffn_dim=53248),
}


def llama_config(name: str, **changes: int | float) -> LlamaConfig:
    """A preset (``llama3-8b``, ``llama3-70b``, ``llama3-405b``) with optional field changes
    (``n_layers=1``)."""
    if name not in PRESETS:
        raise ValueError(f"model: unknown Llama preset {name!r}; presets are {sorted(PRESETS)}")
    return PRESETS[name].replace(**changes) if changes else PRESETS[name]


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x^2) + eps) * weight``, computed in float32 like Meta's reference."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def reset_parameters(self) -> None:
        """What the constructor makes (a model built on the meta device is initialised by it)."""
        nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


def rope_tables(config: LlamaConfig, seq_len: int, device: torch.device | str | None = None) -> torch.Tensor:
    """``[2, seq_len, head_dim]``: cos and sin of position x frequency, each frequency twice (rotate-half)."""
    half = torch.arange(0, config.head_dim, 2, dtype=torch.float32, device=device) / config.head_dim
    freqs = 1.0 / (config.rope_theta**half)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32, device=device), freqs)
    angles = torch.cat([angles, angles], dim=-1)
    return torch.stack([angles.cos(), angles.sin()])


def apply_rope(x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` (``[batch, seq, heads, head_dim]``) by position: ``x cos + rotate_half(x) sin``."""
    cos, sin = rope[0][None, :, None, :], rope[1][None, :, None, :]
    first, second = x.chunk(2, dim=-1)
    rotated = torch.cat([-second, first], dim=-1)
    return (x.float() * cos + rotated.float() * sin).type_as(x)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """``[b, s, kv_heads, d]`` -> ``[b, s, kv_heads * n_rep, d]``: each kv head serves n_rep query heads."""
    if n_rep == 1:
        return x
    b, s, kv, d = x.shape
    return x[:, :, :, None, :].expand(b, s, kv, n_rep, d).reshape(b, s, kv * n_rep, d)


class Attention(nn.Module):
    """Grouped-query causal self-attention with RoPE; no biases."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = config.n_heads, config.n_kv_heads, config.head_dim
        self.wq = nn.Linear(config.dim, config.n_heads * config.head_dim, bias=False)
        self.wk = nn.Linear(config.dim, config.n_kv_heads * config.head_dim, bias=False)
        self.wv = nn.Linear(config.dim, config.n_kv_heads * config.head_dim, bias=False)
        self.wo = nn.Linear(config.n_heads * config.head_dim, config.dim, bias=False)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, self.n_heads, self.head_dim)
        k = self.wk(x).view(b, s, self.n_kv_heads, self.head_dim)
        v = self.wv(x).view(b, s, self.n_kv_heads, self.head_dim)
        q, k = apply_rope(q, rope), apply_rope(k, rope)
        n_rep = self.n_heads // self.n_kv_heads
        k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    """SwiGLU: ``w2(silu(w1(x)) * w3(x))``."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(config.dim, config.ffn_dim, bias=False)
        self.w2 = nn.Linear(config.ffn_dim, config.dim, bias=False)
        self.w3 = nn.Linear(config.dim, config.ffn_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    """One decoder layer: pre-norm attention and feed-forward, each added to the residual stream."""

    def __init__(self, config: LlamaConfig, feed_forward: nn.Module | None = None) -> None:
        """``feed_forward`` replaces the SwiGLU feed-forward (the mixture-of-experts model passes its own)."""
        super().__init__()
        self.attention_norm = RMSNorm(config.dim, config.norm_eps)
        self.attention = Attention(config)
        self.ffn_norm = RMSNorm(config.dim, config.norm_eps)
        self.feed_forward = feed_forward if feed_forward is not None else FeedForward(config)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), rope)
        return h + self.feed_forward(self.ffn_norm(h))


class Llama(nn.Module):
    """Token embedding, ``n_layers`` blocks, final RMSNorm and the (untied) output projection.

    ``block`` makes each decoder layer (``TransformerBlock``; the mixture-of-experts model passes its own).

    ``forward(tokens)`` returns logits ``[batch, seq, vocab]``; with ``targets`` it returns the mean
    cross-entropy loss instead.
    """

    def __init__(
        self, config: LlamaConfig, block: Callable[[LlamaConfig], nn.Module] = TransformerBlock
    ) -> None:
        super().__init__()
        self.config = config
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleList(block(config) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.dim, config.norm_eps)
        self.output = nn.Linear(config.dim, config.vocab_size, bias=False)
        self.register_buffer("rope", rope_tables(config, config.max_seq_len), persistent=False)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        seq_len = tokens.shape[1]
        if seq_len > self.config.max_seq_len:
            raise ValueError(f"tokens: sequence of {seq_len} exceeds max_seq_len {self.config.max_seq_len}")
        h = self.tok_embeddings(tokens)
        rope = self.rope[:, :seq_len]
        for layer in self.layers:
            h = layer(h, rope)
        logits = self.output(self.norm(h))
        if targets is None:
            return logits
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(0, 1))
