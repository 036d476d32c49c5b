"""Paged attention over the KV cache: decode (one query a sequence) and prefill (every prompt and chunk of a step
in one call). None when a case is not covered."""

from __future__ import annotations

import torch

from agents.runtime.kernels import library
from agents.runtime.kernels.abi import MAX_GROUP, MAX_HEAD_DIM
from agents.runtime.kernels.scratch import thread_buffer


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, tables: torch.Tensor,
                           seqlens: torch.Tensor, scale: float, window: int | None) -> torch.Tensor | None:
    """Attention of one query token per sequence over its cached keys: ``q [B, H, D]`` (rows may be strided,
    heads contiguous), caches ``[blocks, block_size, Hkv, D]``, block tables ``[B, width]`` and key counts
    ``[B]`` (int32) -> ``[B, H * D]``; None when not covered."""
    b, heads, d = q.shape
    kv_heads = k_cache.shape[2]
    if (not library.ok(q, k_cache, v_cache) or q.stride(2) != 1 or q.stride(1) != d or not k_cache.is_contiguous()
            or not v_cache.is_contiguous() or tables.dtype is not torch.int32 or seqlens.dtype is not torch.int32
            or not tables.is_contiguous() or not seqlens.is_contiguous() or d > MAX_HEAD_DIM
            or heads % kv_heads or heads // kv_heads > MAX_GROUP or not tables.is_cpu):
        return None
    out = torch.empty(b, heads * d)
    rc = library.lib.day0_paged_decode_attention(
        out.data_ptr(), q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), tables.data_ptr(), seqlens.data_ptr(),
        b, heads, kv_heads, d,
        k_cache.shape[1], tables.shape[1], q.stride(0), scale, window or 0)
    return out if rc == 0 else None


def paged_prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, tables: torch.Tensor,
                            bounds: torch.Tensor, scale: float, window: int | None) -> torch.Tensor | None:
    """Causal attention of every sequence's new queries over its cached keys (stored before the call): ``q [T, H,
    D]`` (rows may be strided, heads contiguous), caches ``[blocks, block_size, Hkv, D]``, block tables ``[B,
    width]`` and ``bounds [3, B]`` (int32: each sequence's first row of q, its new queries, the last positions of
    its ``k_len`` keys; 0 new queries: the sequence is skipped) -> ``[T, H * D]``, the skipped rows unset. None
    when not covered (the head dimension must be a whole number of vectors)."""
    t, heads, d = q.shape
    kv_heads = k_cache.shape[2]
    if (not library.ok(q, k_cache, v_cache) or q.stride(2) != 1 or q.stride(1) != d or not k_cache.is_contiguous()
            or not v_cache.is_contiguous() or tables.dtype is not torch.int32 or bounds.dtype is not torch.int32
            or not tables.is_contiguous() or not bounds.is_contiguous() or not tables.is_cpu or not bounds.is_cpu
            or bounds.dim() != 2 or bounds.shape != (3, tables.shape[0]) or d > MAX_HEAD_DIM or d % library.lanes
            or heads % kv_heads or heads // kv_heads > MAX_GROUP):
        return None
    out = torch.empty(t, heads * d)
    n = bounds.shape[1]
    # every key of the sequences with new queries transposed once, in whole chunks: at most one partial a sequence
    floats = (int(bounds[2].sum()) + n * library.key_chunk) * kv_heads * d
    keys_t = thread_buffer("attn_keys", floats, torch.float32)
    base = bounds.data_ptr()
    rc = library.lib.day0_paged_prefill_attention(
        out.data_ptr(), q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), tables.data_ptr(), base, base + 4 * n,
        base + 8 * n, n, heads, kv_heads, d, k_cache.shape[1], tables.shape[1], q.stride(0), scale, window or 0,
        keys_t.data_ptr(), keys_t.numel())
    return out if rc == 0 else None
