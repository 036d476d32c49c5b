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

    def forward(self, x: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        tokens = x.shape[0]
        q, k, v = self.qkv_proj(x).split(self.sizes, dim=-1)  # q: [T, H*D], k/v: [T, Hkv*D]
        q = q.view(tokens, self.heads, self.head_dim)  # q: [T, H, D]
        k = k.view(tokens, self.kv_heads, self.head_dim)  # k: [T, Hkv, D]
        v = v.view(tokens, self.kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        rope = self.rotary[0]
        q, k = rope.rotate(q, meta.cos, meta.sin), rope.rotate(k, meta.cos, meta.sin)
        return self.o_proj(self.attn(q, k, v, meta))  # [T, hidden]
