"""Multi-head latent attention (DeepSeek-V2/V3). Keys and values are compressed into one latent per token
(``kv_lora_rank``) plus a decoupled rope key shared by all heads (``qk_rope_head_dim``); the paged cache keeps
only ``[latent | rope key]``. Prefill up-projects the latents through ``kv_b_proj``; decode absorbs
``kv_b_proj`` into the query and the output, attending over the cached latents directly. Heads split over TP.
In FP8 checkpoints every projection here is block-quantised; weight loaders dequantise at load time
(``layers/quant.py``), so the absorption reads the dequantised ``kv_b_proj`` and no FP8 tensor survives loading.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from agents.runtime.context import ForwardContext
from agents.runtime.distributed import get_tp_world_size
from agents.runtime.layers.attention import AttentionMetadata
from agents.runtime.layers.linear import ColumnParallelLinear, ReplicatedLinear, RowParallelLinear
from agents.runtime.layers.norm import RMSNorm
from agents.runtime.layers.rotary import RotaryEmbedding, rope_parameters
from agents.runtime.layers.weights import split


def _yarn_mscale(scale: float, mscale: float) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def mla_softmax_scale(config: dict[str, Any]) -> float:
    """``qk_head_dim ** -0.5``, times ``mscale(factor, mscale_all_dim) ** 2`` under YaRN (DeepSeek's rule)."""
    scale = (config["qk_nope_head_dim"] + config["qk_rope_head_dim"]) ** -0.5
    params = rope_parameters(config)
    if params["rope_type"] != "default" and params.get("mscale_all_dim"):
        factor = params.get("factor") or config["max_position_embeddings"] / params["original_max_position_embeddings"]
        m = _yarn_mscale(factor, params["mscale_all_dim"])
        scale = scale * m * m
    return scale


def gather_latents(
    cache: torch.Tensor,  # [num_blocks, block_size, D]
    block_tables: torch.Tensor,  # [B, max_blocks]
    seqlens_k: torch.Tensor,  # [B]
    max_k: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``seqlens_k[b]`` cached latents of every sequence, padded: ([B, max_k, D], valid [B, max_k])."""
    block_size = cache.shape[1]
    pos = torch.arange(max_k, device=cache.device)  # [K]
    blocks = block_tables.long()[:, pos // block_size].clamp_min(0)  # [B, K]
    slots = blocks * block_size + pos % block_size  # [B, K]
    valid = pos[None, :] < seqlens_k.long()[:, None]  # [B, K]
    return cache.view(-1, cache.shape[-1])[slots], valid  # [B, K, D]


class MLAttention(nn.Module):
    """One MLA layer: ``forward(hidden [T, hidden], meta) -> [T, hidden]``. ``rotary`` (over the rope part,
    shared by all layers) rotates with the cos/sin the model put in ``meta``."""

    def __init__(self, config: dict[str, Any], rotary: RotaryEmbedding) -> None:
        super().__init__()
        hidden, eps = config["hidden_size"], config.get("rms_norm_eps", 1e-6)
        self.num_heads = split(config["num_attention_heads"], get_tp_world_size(), "num_attention_heads")
        self.q_lora_rank = config.get("q_lora_rank")
        self.kv_lora_rank = config["kv_lora_rank"]
        self.nope_dim, self.rope_dim = config["qk_nope_head_dim"], config["qk_rope_head_dim"]
        self.v_dim = config["v_head_dim"]
        self.qk_dim = self.nope_dim + self.rope_dim
        heads, bias = config["num_attention_heads"], bool(config.get("attention_bias", False))
        if self.q_lora_rank is None:
            self.q_proj = ColumnParallelLinear(hidden, [heads * self.qk_dim])
        else:
            self.q_a_proj = ReplicatedLinear(hidden, self.q_lora_rank, bias=bias)
            self.q_a_layernorm = RMSNorm(self.q_lora_rank, eps)
            self.q_b_proj = ColumnParallelLinear(self.q_lora_rank, [heads * self.qk_dim])
        self.kv_a_proj_with_mqa = ReplicatedLinear(hidden, self.kv_lora_rank + self.rope_dim, bias=bias)
        self.kv_a_layernorm = RMSNorm(self.kv_lora_rank, eps)
        self.kv_b_proj = ColumnParallelLinear(self.kv_lora_rank, [heads * (self.nope_dim + self.v_dim)])
        self.kv_b_proj.weight.native_fp8 = False  # read directly (absorbed into q and o): never held in FP8
        self.o_proj = RowParallelLinear(heads * self.v_dim, hidden, bias=bias)
        if rotary.rotary_dim != self.rope_dim:
            raise ValueError(f"rotary dim {rotary.rotary_dim} != qk_rope_head_dim {self.rope_dim}")
        self.rotary = [rotary]  # shared across layers; a list keeps it out of this module's children
        self.scale = mla_softmax_scale(config)
        self.cache: torch.Tensor | None = None  # [num_blocks, block_size, kv_lora_rank + rope_dim]

    @property
    def latent_dim(self) -> int:
        return self.kv_lora_rank + self.rope_dim

    def forward(self, hidden: torch.Tensor, meta: AttentionMetadata, rows: torch.Tensor | None = None) -> torch.Tensor:
        """[T, hidden] -> [T, hidden], or [N, hidden] for ``rows`` [N] only (every token's latent is cached)."""
        ctx, t = meta.ctx, hidden.shape[0]
        if self.q_lora_rank is None:
            q = self.q_proj(hidden)  # q: [T, H * qk]
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden)))  # q: [T, H * qk]
        q_nope, q_pe = q.view(t, self.num_heads, self.qk_dim).split([self.nope_dim, self.rope_dim], dim=-1)
        latent, k_pe = self.kv_a_proj_with_mqa(hidden).split([self.kv_lora_rank, self.rope_dim], dim=-1)
        latent = self.kv_a_layernorm(latent)  # [T, C]
        rope = self.rotary[0]
        q_pe = rope.rotate(q_pe, meta.cos, meta.sin)  # [T, H, R]
        k_pe = rope.rotate(k_pe.unsqueeze(1), meta.cos, meta.sin)  # [T, 1, R]
        fresh = torch.cat([latent, k_pe.squeeze(1)], dim=-1)  # [T, C + R]
        if ctx.uses_cache:
            if self.cache is None:
                raise RuntimeError("MLA layer has no bound latent cache but the context uses the paged cache")
            flat = self.cache.view(-1, self.latent_dim)  # [slots, C + R]
            stored = fresh if meta.slot_rows is None else fresh[meta.slot_rows]  # padding slots (-1) not stored
            flat.index_copy_(0, meta.slots, stored.to(flat.dtype))
        if ctx.uses_cache and ctx.is_decode:
            out = self._decode_absorbed(q_nope, q_pe, ctx)  # [T, H, V]
        else:
            out = self._prefill(q_nope, q_pe, fresh, meta)  # [T, H, V]
        out = out.reshape(t, self.num_heads * self.v_dim)  # [T, H * V]
        return self.o_proj(out if rows is None else out.index_select(0, rows))  # [T | N, hidden]

    def _expand(self, lat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Latents [K, C + R] -> keys [K, H, qk], values [K, H, V]."""
        k = lat.shape[0]
        kv = self.kv_b_proj(lat[:, : self.kv_lora_rank]).view(k, self.num_heads, self.nope_dim + self.v_dim)
        k_nope, v = kv.split([self.nope_dim, self.v_dim], dim=-1)
        k_pe = lat[:, None, self.kv_lora_rank :].expand(k, self.num_heads, self.rope_dim)  # [K, H, R]
        return torch.cat([k_nope, k_pe], dim=-1), v

    def _prefill(self, q_nope: torch.Tensor, q_pe: torch.Tensor, fresh: torch.Tensor, meta: AttentionMetadata,
                 ) -> torch.Tensor:
        ctx = meta.ctx
        q = torch.cat([q_nope, q_pe], dim=-1)  # [T, H, qk]
        out = q.new_empty(q.shape[0], self.num_heads, self.v_dim)  # [T, H, V]
        for b, (start, q_len, k_len) in enumerate(meta.q_bounds):
            end = start + q_len
            if q_len == 0:
                continue
            if ctx.uses_cache:
                lat, _ = gather_latents(self.cache, ctx.block_tables[b : b + 1], ctx.seqlens_k[b : b + 1], k_len)
                lat = lat[0].to(q.dtype)  # [K, C + R]
            else:
                lat = fresh[start:end]  # [K, C + R]
            k, v = self._expand(lat)  # [K, H, qk], [K, H, V]
            qi, ki, vi = q[start:end].transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)  # [H, Q|K, D]
            if q_len == k_len:
                o = F.scaled_dot_product_attention(qi, ki, vi, is_causal=True, scale=self.scale)  # o: [H, Q, V]
            else:  # query i sits at absolute position k_len - q_len + i and sees keys up to it
                mask = torch.ones(q_len, k_len, dtype=torch.bool, device=q.device).tril(k_len - q_len)
                o = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask, scale=self.scale)
            out[start:end] = o.transpose(0, 1)
        return out

    def _decode_absorbed(self, q_nope: torch.Tensor, q_pe: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        w = self.kv_b_proj.weight.view(self.num_heads, self.nope_dim + self.v_dim, self.kv_lora_rank)
        w_k, w_v = w[:, : self.nope_dim], w[:, self.nope_dim :]  # [H, N, C], [H, V, C]
        lat, valid = gather_latents(self.cache, ctx.block_tables, ctx.seqlens_k, ctx.max_seqlen_k)  # [B, K, C+R]
        lat = lat.to(q_nope.dtype)
        c, k_pe = lat[..., : self.kv_lora_rank], lat[..., self.kv_lora_rank :]  # [B, K, C], [B, K, R]
        q_lat = torch.einsum("bhn,hnc->bhc", q_nope, w_k)  # [B, H, C]
        scores = torch.einsum("bhc,bkc->bhk", q_lat, c) + torch.einsum("bhr,bkr->bhk", q_pe, k_pe)  # [B, H, K]
        scores = (scores.float() * self.scale).masked_fill(~valid[:, None, :], float("-inf"))
        probs = scores.softmax(dim=-1).to(c.dtype)  # [B, H, K]
        o_lat = torch.einsum("bhk,bkc->bhc", probs, c)  # [B, H, C]
        return torch.einsum("bhc,hvc->bhv", o_lat, w_v)  # [B, H, V]
