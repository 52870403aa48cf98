"""A small mixture-of-experts transformer: Llama 3 blocks whose feed-forward is a top-k routed MoE.

Each token's router scores (a softmax over ``n_experts``) pick its ``top_k`` experts, weighted by the
chosen scores renormalised to sum to one (Mixtral). Experts are SwiGLU feed-forwards stored as stacked
weights ``w1, w3: [experts, dim, hidden]``, ``w2: [experts, hidden, dim]`` and run as batched matrix
products over a fixed-shape dispatch buffer ``[experts, capacity, dim]`` (GShard / Switch Transformer):

- assignments are taken choice-major (every token's first choice before any second choice); an
  assignment's position is the number of earlier assignments to the same expert (a cumulative sum);
  those at a position ``>= capacity`` are dropped, with ``capacity = ceil(capacity_factor * tokens *
  top_k / n_experts)``;
- dispatch gathers each slot's token, the experts are three ``bmm``, and combine gathers each kept
  assignment's slot back, scales it by its weight and sums a token's ``top_k`` results. Both gathers are
  row lookups written as ``F.embedding``: its backward (``embedding_dense_backward``) has sharding rules,
  where ``index_select``'s (``index_add``) has none.

So every shape is fixed by the configuration and the batch (planning needs no data), and the experts
are ``bmm`` over an expert dim that can be sharded (expert parallelism). Slots no token fills hold an
arbitrary token; nothing reads them back, so they change neither the output nor the gradients. No
auxiliary load-balancing loss.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from strategies.models.llama import Llama, LlamaConfig, TransformerBlock
from strategies.models.options import ModelOptionError


@dataclass(frozen=True)
class MoEConfig(LlamaConfig):
    """A Llama 3 shape plus the experts that replace its feed-forward (defaults: ~0.5B parameters)."""

    dim: int = 1024
    """Width of the residual stream."""
    n_layers: int = 8
    """Decoder blocks, each with its own experts."""
    n_heads: int = 16
    """Query heads."""
    n_kv_heads: int = 4
    """Key/value heads (grouped-query attention)."""
    vocab_size: int = 32000
    """Tokens in the vocabulary."""
    ffn_dim: int = 2048
    """Hidden width of each expert's SwiGLU."""
    n_experts: int = 8
    """Experts per layer."""
    top_k: int = 2
    """Experts each token is routed to."""
    capacity_factor: float = 1.25
    """Slots per expert as a multiple of the even share ``tokens * top_k / n_experts``."""

    def __post_init__(self) -> None:
        """The Llama checks (every field, including ``capacity_factor > 0``, by its type), then
        ``top_k <= n_experts``."""
        super().__post_init__()
        if not 1 <= self.top_k <= self.n_experts:
            raise ModelOptionError(
                "top_k", f"top_k ({self.top_k}) must be in 1..n_experts ({self.n_experts})"
            )

    def capacity(self, tokens: int) -> int:
        """Slots per expert for a batch of ``tokens`` tokens."""
        return math.ceil(self.capacity_factor * tokens * self.top_k / self.n_experts)

    def largest_tensors(self, tokens: int) -> dict[str, float]:
        """The Llama model's largest tensors and the experts' (see :meth:`LlamaConfig.largest_tensors`);
        a capacity too large for a float is ``inf`` slots."""
        share = self.capacity_factor * tokens * self.top_k / self.n_experts
        slots = self.n_experts * math.ceil(share) if math.isfinite(share) else math.inf
        return {
            **super().largest_tensors(tokens),
            "an expert weight stack (n_experts x dim x ffn_dim)": self.n_experts * self.dim * self.ffn_dim,
            "the routing one-hot (top_k x batch x seq x n_experts)": self.top_k * tokens * self.n_experts,
            "the traced running count of the one-hot ((top_k x batch x seq)^2 x n_experts: torch's meta "
            "cumsum is quadratic)": (self.top_k * tokens) ** 2 * self.n_experts,
            "the dispatch buffer (n_experts x capacity x dim)": slots * self.dim,
            "the experts' activations (n_experts x capacity x ffn_dim)": slots * self.ffn_dim,
            "the combined outputs (top_k x batch x seq x dim)": self.top_k * tokens * self.dim,
        }


def dispatch_slots(experts: torch.Tensor, n_experts: int, capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Where each assignment goes, for ``experts`` ``[tokens, top_k]`` (chosen expert ids).

    Returns ``(slot, kept)``, both ``[top_k * tokens]`` in choice-major order: ``slot = expert * capacity +
    position`` in the flattened ``[n_experts * capacity]`` buffer (0 where dropped) and whether it was kept.
    """
    choices = experts.t().reshape(-1)
    one_hot = (choices[:, None] == torch.arange(n_experts, device=choices.device)).long()
    position = (one_hot.cumsum(0) * one_hot).sum(-1) - 1
    kept = position < capacity
    return torch.where(kept, choices * capacity + position, 0), kept


class MoE(nn.Module):
    """Top-k routed SwiGLU experts on a ``[batch, seq, dim]`` residual stream."""

    def __init__(self, config: MoEConfig) -> None:
        super().__init__()
        self.config = config
        e, d, h = config.n_experts, config.dim, config.ffn_dim
        self.router = nn.Linear(d, e, bias=False)
        self.w1 = nn.Parameter(torch.empty(e, d, h))
        self.w2 = nn.Parameter(torch.empty(e, h, d))
        self.w3 = nn.Parameter(torch.empty(e, d, h))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The experts' weights (the router is its own ``nn.Linear``): normal, std ``1/sqrt(fan_in)``."""
        d, h = self.config.dim, self.config.ffn_dim
        for w, fan_in in ((self.w1, d), (self.w2, h), (self.w3, d)):
            nn.init.normal_(w, std=fan_in**-0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Route, dispatch into ``[experts, capacity, dim]``, run the experts, combine (module docstring)."""
        b, s, d = x.shape
        e, k = self.config.n_experts, self.config.top_k
        tokens = x.reshape(b * s, d)
        scores = self.router(tokens).float().softmax(dim=-1)
        weights, experts = scores.topk(k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        capacity = self.config.capacity(b * s)
        slot, kept = dispatch_slots(experts, e, capacity)
        slot_tokens = self._slot_tokens(slot, kept, e * capacity, b * s)
        expert_in = F.embedding(slot_tokens, tokens).view(e, capacity, d)
        hidden = F.silu(torch.bmm(expert_in, self.w1)) * torch.bmm(expert_in, self.w3)
        expert_out = torch.bmm(hidden, self.w2).view(e * capacity, d)
        gate = (weights.t().reshape(-1) * kept).to(x.dtype)
        combined = F.embedding(slot, expert_out) * gate[:, None]
        return combined.view(k, b * s, d).sum(dim=0).view(b, s, d)

    @staticmethod
    def _slot_tokens(slot: torch.Tensor, kept: torch.Tensor, n_slots: int, n_tokens: int) -> torch.Tensor:
        """The token in each of ``n_slots`` slots (0 where none): each kept assignment writes its token id
        into its slot, dropped ones into a spare slot past the end, which is then cut off."""
        top_k = slot.numel() // n_tokens
        token = torch.arange(n_tokens, device=slot.device)[None, :].expand(top_k, n_tokens).reshape(-1)
        target = torch.where(kept, slot, n_slots)
        with_spare = torch.zeros(n_slots + 1, dtype=torch.long, device=slot.device)
        return with_spare.scatter(0, target, token)[:n_slots]


class MoETransformer(Llama):
    """Token embedding, ``n_layers`` Llama blocks whose feed-forward is :class:`MoE`, final RMSNorm and
    output projection; with ``targets`` it returns the mean cross-entropy loss."""

    def __init__(self, config: MoEConfig) -> None:
        super().__init__(config, block=lambda c: TransformerBlock(c, feed_forward=MoE(c)))
