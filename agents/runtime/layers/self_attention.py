"""The attention block of a decoder layer: packed QKV projection, optional QK-norm, RoPE, paged attention,
row-parallel output projection."""

from __future__ import annotations

import torch
from torch import nn

from agents.runtime.layers.attention import Attention, AttentionMetadata
from agents.runtime.layers.linear import QKVParallelLinear, RowParallelLinear
from agents.runtime.layers.norm import RMSNorm
from agents.runtime.layers.rotary import RotaryEmbedding


class SelfAttention(nn.Module):
    def __init__(self, hidden: int, num_heads: int, num_kv_heads: int, head_dim: int, rotary: RotaryEmbedding, *,
                 qkv_bias: bool = False, o_bias: bool = False, qk_norm_eps: float | None = None,
                 sliding_window: int | None = None) -> None:
        super().__init__()
        self.qkv_proj = QKVParallelLinear(hidden, head_dim, num_heads, num_kv_heads, bias=qkv_bias)
        self.o_proj = RowParallelLinear(num_heads * head_dim, hidden, bias=o_bias)
        self.heads, self.kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.head_dim = head_dim
        self.sizes = [self.heads * head_dim, self.kv_heads * head_dim, self.kv_heads * head_dim]
        self.q_norm = RMSNorm(head_dim, qk_norm_eps) if qk_norm_eps is not None else None
        self.k_norm = RMSNorm(head_dim, qk_norm_eps) if qk_norm_eps is not None else None
        self.rotary = [rotary]  # shared across layers; a list keeps it out of this module's children
        self.attn = Attention(self.heads, self.kv_heads, head_dim, head_dim**-0.5, sliding_window)

    def forward(self, x: torch.Tensor, meta: AttentionMetadata, rows: torch.Tensor | None = None) -> torch.Tensor:
        """[T, hidden] -> [T, hidden], or [N, hidden] for ``rows`` [N] only (every token's K/V is cached)."""
        tokens, heads, kv_heads = x.shape[0], self.heads, self.kv_heads
        qkv = self.qkv_proj(x)  # qkv: [T, (H + 2 Hkv) * D]
        qk = qkv[:, : (heads + kv_heads) * self.head_dim].view(tokens, heads + kv_heads, self.head_dim)
        v = qkv[:, (heads + kv_heads) * self.head_dim :].view(tokens, kv_heads, self.head_dim)  # v: [T, Hkv, D]
        if self.q_norm is not None:
            qk = torch.cat((self.q_norm(qk[:, :heads]), self.k_norm(qk[:, heads:])), dim=1)
        qk = self.rotary[0].rotate_(qk, meta.cos, meta.sin)  # q and k rotated together (qkv is ours): [T, H + Hkv, D]
        out = self.attn(qk[:, :heads], qk[:, heads:], v, meta)  # [T, H * D]
        return self.o_proj(out if rows is None else out.index_select(0, rows))  # [T | N, hidden]
