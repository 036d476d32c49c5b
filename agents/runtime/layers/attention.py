"""Attention over a ``ForwardContext``: no cache, paged prefill (chunked, with a cached prefix; fp32 CPU: one native
call for the whole step) and a vectorised paged decode. K/V caches are ``[num_blocks, block_size, kv_heads_local, head_dim]``."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from agents.runtime import kernels
from agents.runtime.context import ForwardContext

SMALL_DECODE = 1 << 20  # multiply-adds of Q·K below which the torch decode path skips SDPA's fused kernel


@dataclass
class AttentionMetadata:
    """Everything the layers derive from a ``ForwardContext``, computed once per forward (not per layer)."""

    ctx: ForwardContext
    cos: torch.Tensor | None = None  # [T, 1, 2, rot/2] rotary tables (layout: RotaryEmbedding.cos_sin)
    sin: torch.Tensor | None = None
    q_bounds: list[tuple[int, int, int]] | None = None  # per sequence: (q start, q len, k len)
    slots: torch.Tensor | None = None  # [T'] valid cache slots of the new tokens
    slot_rows: torch.Tensor | None = None  # [T'] rows of the batch those slots belong to; None: all rows
    decode_blocks: torch.Tensor | None = None  # [B * nb] block ids (padding clamped to 0)
    decode_mask: torch.Tensor | None = None  # [B, 1, 1, nb * block_size] keys each sequence may attend to
    decode_bias: torch.Tensor | None = None  # the same as 0 / -inf, added to scores
    # A mixed batch (chunked prefill beside running decodes): its one-token sequences take the vectorised path.
    decode_rows: torch.Tensor | None = None  # [Bd] token rows of the one-token sequences
    decode_meta: AttentionMetadata | None = None  # a decode-only view of those sequences
    decode_seqs: frozenset[int] = frozenset()  # their indices, skipped by the per-sequence prefill loop
    uniform_len: int = 0  # > 0: every sequence is a whole prompt of this length (one batched attention call)
    prefill_bounds: torch.Tensor | None = None  # [3, B] int32 for the native prefill kernel (made on first use)

    @classmethod
    def build(cls, ctx: ForwardContext) -> AttentionMetadata:
        meta = cls(ctx)
        if ctx.uses_cache:
            slots = ctx.slot_mapping
            valid = slots >= 0
            if bool(valid.all()):
                meta.slots = slots
            else:
                meta.slot_rows = valid.nonzero().squeeze(1)
                meta.slots = slots.index_select(0, meta.slot_rows)
        if not ctx.is_decode:
            starts = ctx.cu_seqlens_q.tolist()
            k_lens = ctx.seqlens_k.tolist()
            meta.q_bounds = [(s, e - s, k) for s, e, k in zip(starts[:-1], starts[1:], k_lens, strict=True)]
            lengths = {(n, k) for _s, n, k in meta.q_bounds}
            if len(meta.q_bounds) > 1 and len(lengths) == 1 and (n := lengths.pop())[0] == n[1] > 0:
                meta.uniform_len = n[0]
            if ctx.uses_cache:
                meta._split_decodes(starts, k_lens)
        return meta

    def native_bounds(self) -> torch.Tensor:
        """Each sequence's first row, new queries (0 for the one-token ones the decode path takes) and keys, as
        ``kernels.paged_prefill_attention`` reads them; made once per forward, for all layers."""
        if self.prefill_bounds is None:
            rows = [[s for s, _n, _k in self.q_bounds],
                    [0 if i in self.decode_seqs else n for i, (_s, n, _k) in enumerate(self.q_bounds)],
                    [k for _s, _n, k in self.q_bounds]]
            self.prefill_bounds = torch.tensor(rows, dtype=torch.int32)
        return self.prefill_bounds

    def _split_decodes(self, starts: list[int], k_lens: list[int]) -> None:
        single = [i for i, (_s, n, _k) in enumerate(self.q_bounds) if n == 1]
        if len(single) < 2:
            return
        ctx, dev = self.ctx, self.ctx.cu_seqlens_q.device
        seqs = torch.tensor(single, device=dev)
        self.decode_rows = torch.tensor([starts[i] for i in single], device=dev)
        sub = ForwardContext(
            cu_seqlens_q=torch.arange(len(single) + 1, dtype=torch.int32, device=dev),
            seqlens_k=ctx.seqlens_k.index_select(0, seqs), max_seqlen_q=1,
            max_seqlen_k=max(k_lens[i] for i in single), block_tables=ctx.block_tables.index_select(0, seqs),
            is_decode=True,
        )
        self.decode_meta = AttentionMetadata(sub)
        self.decode_seqs = frozenset(single)


def _key_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None) -> torch.Tensor:
    """Causal (and sliding-window) mask ``[Lq, Lk]`` from absolute positions."""
    mask = k_pos[None, :] <= q_pos[:, None]
    if window is not None:
        mask &= k_pos[None, :] > q_pos[:, None] - window
    return mask


class Attention(nn.Module):
    """Scaled dot-product attention with GQA over local heads; the cache is bound by the model."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float,
                 sliding_window: int | None = None) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.group = num_heads // num_kv_heads
        self.scale = scale
        self.sliding_window = sliding_window
        self.k_cache: torch.Tensor | None = None
        self.v_cache: torch.Tensor | None = None
        self._k_slots: torch.Tensor | None = None  # the caches viewed as [slots, Hkv, D], made once
        self._v_slots: torch.Tensor | None = None

    def bind(self, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
        """Attach this layer's ``[num_blocks, block_size, Hkv, D]`` caches."""
        self.k_cache, self.v_cache = k_cache, v_cache
        self._k_slots = k_cache.view(-1, self.num_kv_heads, self.head_dim)
        self._v_slots = v_cache.view(-1, self.num_kv_heads, self.head_dim)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """q: [T, H, D], k/v: [T, Hkv, D] -> [T, H * D]."""
        ctx = meta.ctx
        if not ctx.uses_cache:
            return self._prefill(q, lambda _i, s, n, _k: (k[s : s + n], v[s : s + n]), meta)
        if self.k_cache is None:
            raise RuntimeError("paged attention called before bind_kv_cache")
        self._store(k, v, meta)
        if ctx.is_decode:
            return self._decode(q, meta)
        out = None
        if meta.slot_rows is None and q.is_cpu:
            # fp32 CPU: every sequence's queries over its keys where they lie in the paged cache, in one call
            out = kernels.paged_prefill_attention(q, self.k_cache, self.v_cache, ctx.block_tables,
                                                  meta.native_bounds(), self.scale, self.sliding_window)
        # a sequence with no cached prefix attends to exactly its new keys: no gather from the cache
        if out is None:
            out = self._prefill(q, lambda i, s, n, k_len: (k[s : s + n], v[s : s + n]) if n == k_len else
                                self._gather_sequence(ctx, i, k_len), meta)
        if meta.decode_rows is not None:
            decoded = self._decode(q.index_select(0, meta.decode_rows), meta.decode_meta)  # [Bd, H * D]
            out.index_copy_(0, meta.decode_rows, decoded)
        return out

    def _store(self, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata) -> None:
        k_flat, v_flat = self._k_slots, self._v_slots  # [slots, Hkv, D]
        if meta.slot_rows is not None:
            k, v = k.index_select(0, meta.slot_rows), v.index_select(0, meta.slot_rows)
        if k.dtype != k_flat.dtype:
            k, v = k.to(k_flat.dtype), v.to(v_flat.dtype)
        k_flat.index_copy_(0, meta.slots, k)
        v_flat.index_copy_(0, meta.slots, v)

    def _gather_sequence(self, ctx: ForwardContext, index: int, k_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        blocks = ctx.block_tables[index, : -(-k_len // self.k_cache.shape[1])].long()
        # index_select copies whole blocks as rows: much cheaper and steadier than advanced indexing k[idx]
        k = self.k_cache.index_select(0, blocks).flatten(0, 1)[:k_len]  # k: [Lk, Hkv, D]
        v = self.v_cache.index_select(0, blocks).flatten(0, 1)[:k_len]
        return k, v

    def _prefill(self, q: torch.Tensor, keys_of, meta: AttentionMetadata) -> torch.Tensor:
        if meta.uniform_len and self.sliding_window is None and not meta.decode_seqs:
            return self._prefill_uniform(q, keys_of, meta)
        out = torch.empty(q.shape[0], self.num_heads * self.head_dim, dtype=q.dtype, device=q.device)
        for i, (start, q_len, k_len) in enumerate(meta.q_bounds):
            if q_len == 0 or i in meta.decode_seqs:
                continue
            k, v = keys_of(i, start, q_len, k_len)
            qi = q[start : start + q_len].transpose(0, 1).unsqueeze(0)  # qi: [1, H, Lq, D]
            ki = k.to(q.dtype).transpose(0, 1).unsqueeze(0)  # ki: [1, Hkv, Lk, D]
            vi = v.to(q.dtype).transpose(0, 1).unsqueeze(0)
            if q_len == k_len and self.sliding_window is None:
                o = F.scaled_dot_product_attention(qi, ki, vi, is_causal=True, scale=self.scale, enable_gqa=True)
            else:
                q_pos = torch.arange(k_len - q_len, k_len, device=q.device)
                mask = _key_mask(q_pos, torch.arange(k_len, device=q.device), self.sliding_window)
                o = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask, scale=self.scale, enable_gqa=True)
            out[start : start + q_len] = o[0].transpose(0, 1).flatten(1)  # [Lq, H * D]
        return out

    def _prefill_uniform(self, q: torch.Tensor, keys_of, meta: AttentionMetadata) -> torch.Tensor:
        """Whole prompts of one length, none cached: one causal attention call for the batch."""
        b, n = len(meta.q_bounds), meta.uniform_len
        k, v = keys_of(0, 0, q.shape[0], q.shape[0])  # all rows: [T, Hkv, D] each
        qb = q.reshape(b, n, self.num_heads, self.head_dim).transpose(1, 2)  # qb: [B, H, L, D]
        kb = k.to(q.dtype).reshape(b, n, self.num_kv_heads, self.head_dim).transpose(1, 2)  # kb: [B, Hkv, L, D]
        vb = v.to(q.dtype).reshape(b, n, self.num_kv_heads, self.head_dim).transpose(1, 2)
        o = F.scaled_dot_product_attention(qb, kb, vb, is_causal=True, scale=self.scale, enable_gqa=True)
        return o.transpose(1, 2).reshape(b * n, self.num_heads * self.head_dim)  # [T, H * D]

    def _decode(self, q: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        ctx = meta.ctx
        # fp32 CPU: keys and values read where they lie in the paged cache, by one fused kernel
        out = kernels.paged_decode_attention(q, self.k_cache, self.v_cache, ctx.block_tables, ctx.seqlens_k,
                                             self.scale, self.sliding_window)
        if out is not None:
            return out
        block_size = self.k_cache.shape[1]
        if meta.decode_blocks is None:  # first layer of this step: shared by all layers
            nb = min(-(-ctx.max_seqlen_k // block_size), ctx.block_tables.shape[1])
            meta.decode_blocks = ctx.block_tables[:, :nb].clamp(min=0).long().reshape(-1)  # [B * nb]
            keys = torch.arange(nb * block_size, device=q.device)[None, :]  # [1, Lk]
            seqlens = ctx.seqlens_k.long()[:, None]  # [B, 1]
            mask = keys < seqlens
            if self.sliding_window is not None:
                mask &= keys >= seqlens - self.sliding_window
            meta.decode_mask = mask[:, None, None, :]  # [B, 1, 1, Lk]
            meta.decode_bias = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill_(
                ~mask, float("-inf"))[:, None, None, :]  # [B, 1, 1, Lk] additive form of the mask
        b = ctx.block_tables.shape[0]
        keys = meta.decode_mask.shape[-1]
        k = self.k_cache.index_select(0, meta.decode_blocks).view(b, keys, self.num_kv_heads, self.head_dim)
        v = self.v_cache.index_select(0, meta.decode_blocks).view(b, keys, self.num_kv_heads, self.head_dim)
        if k.dtype != q.dtype:
            k, v = k.to(q.dtype), v.to(q.dtype)
        # Query heads of one KV group ride the "query length" axis, so no K/V repeat is needed.
        qg = q.view(b, self.num_kv_heads, self.group, self.head_dim)  # qg: [B, Hkv, G, D]
        if q.dtype == torch.float32 and b * self.num_heads * keys * self.head_dim <= SMALL_DECODE:
            # Small fp32 problems (where the native kernel is not loaded): plain matmuls and a softmax stay on
            # the calling thread, where SDPA's fused kernel would open a parallel region per call (costly when
            # the cores are busy).
            scores = torch.add(meta.decode_bias, torch.matmul(qg, k.permute(0, 2, 3, 1)), alpha=self.scale)
            o = torch.matmul(torch.softmax(scores, dim=-1), v.transpose(1, 2))  # o: [B, Hkv, G, D]
        else:
            o = F.scaled_dot_product_attention(
                qg, k.transpose(1, 2), v.transpose(1, 2), attn_mask=meta.decode_mask, scale=self.scale
            )  # o: [B, Hkv, G, D]
        return o.reshape(b, self.num_heads * self.head_dim)
