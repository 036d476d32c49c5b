"""The paged attention kernels (``agents.runtime.kernels.attention``): decode over scattered blocks and prefill
against the causal reference, with GQA groups and sliding windows, and the cases they refuse."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from agents.runtime import kernels

needs_kernels = pytest.mark.skipif(not kernels.available(), reason=f"kernels not built: {kernels.status()}")


def paged_reference(q, k_cache, v_cache, tables, lengths, scale, window):
    out = []
    for i, n in enumerate(lengths):
        blocks = torch.tensor(tables[i], dtype=torch.long)
        k = k_cache.index_select(0, blocks).flatten(0, 1)[:n]
        v = v_cache.index_select(0, blocks).flatten(0, 1)[:n]
        if window:
            k, v = k[-window:], v[-window:]
        o = F.scaled_dot_product_attention(q[i : i + 1].transpose(0, 1)[None].double(), k.transpose(0, 1)[None].double(),
                                           v.transpose(0, 1)[None].double(), scale=scale, enable_gqa=True)
        out.append(o[0].transpose(0, 1).flatten().float())
    return torch.stack(out)


@needs_kernels
@pytest.mark.parametrize("heads,kv_heads,head_dim,window", [
    (12, 4, 64, None), (4, 4, 32, None), (8, 1, 80, 37), (16, 2, 128, None),
    (16, 2, 64, 5),  # two blocks of 4 query heads, a window inside one chunk
    (8, 2, 256, None), (6, 2, 40, None),  # one head per block; a partial last vector
    (4, 2, 36, None), (2, 1, 18, 3),  # partial last vectors at 16, 8 and 4 lanes
])
def test_paged_decode_attention_reads_scattered_blocks(heads, kv_heads, head_dim, window):
    g = torch.Generator().manual_seed(heads * head_dim)
    blocks, block_size = 96, 16
    k_cache = torch.randn(blocks, block_size, kv_heads, head_dim, generator=g)
    v_cache = torch.randn(blocks, block_size, kv_heads, head_dim, generator=g)
    lengths = [1, 16, 17, 31, 33, 200, 64]
    free = torch.randperm(blocks, generator=g).tolist()
    tables = [[free.pop() for _ in range(-(-n // block_size))] for n in lengths]
    width = max(map(len, tables)) + 2  # padded past the longest, as the runner pads
    table_t = torch.tensor([t + [-1] * (width - len(t)) for t in tables], dtype=torch.int32)
    q = torch.randn(len(lengths), heads + 2 * kv_heads, head_dim, generator=g)[:, :heads] * 4  # rows strided
    scale = head_dim**-0.5
    got = kernels.paged_decode_attention(q, k_cache, v_cache, table_t, torch.tensor(lengths, dtype=torch.int32),
                                         scale, window)
    torch.testing.assert_close(got, paged_reference(q, k_cache, v_cache, tables, lengths, scale, window),
                               rtol=1e-5, atol=1e-5)


def prefill_reference(q, k_cache, v_cache, tables, bounds, scale, window):
    """Each sequence's new queries (the last q_len of its k_len positions) over its keys, gathered block by block,
    causal (and windowed), in float64: {row: [H * D]} for the rows the kernel writes."""
    out = {}
    heads, d = q.shape[1], q.shape[2]
    for i, (start, q_len, k_len) in enumerate(zip(*bounds, strict=True)):
        if q_len == 0:
            continue
        blocks = torch.tensor(tables[i], dtype=torch.long)
        k = k_cache.index_select(0, blocks).flatten(0, 1)[:k_len].double()
        v = v_cache.index_select(0, blocks).flatten(0, 1)[:k_len].double()
        q_pos = torch.arange(k_len - q_len, k_len)
        k_pos = torch.arange(k_len)
        mask = k_pos[None, :] <= q_pos[:, None]
        if window:
            mask &= k_pos[None, :] > q_pos[:, None] - window
        qi = q[start : start + q_len].double().transpose(0, 1)[None]  # [1, H, Lq, D]
        o = F.scaled_dot_product_attention(qi, k.transpose(0, 1)[None], v.transpose(0, 1)[None], attn_mask=mask,
                                           scale=scale, enable_gqa=True)
        for r in range(q_len):
            out[start + r] = o[0, :, r].reshape(heads * d).float()
    return out


@needs_kernels
@pytest.mark.parametrize("heads,kv_heads,head_dim,window,block_size", [
    (12, 4, 64, None, 16),  # the 100M test models' attention
    (8, 8, 32, None, 16), (16, 2, 128, None, 32), (4, 1, 80, 37, 16),  # group of 4, a window across chunks
    (32, 1, 16, 7, 8),  # 32 query heads a group: 3 queries an item; a window inside a chunk
    (6, 2, 48, None, 4), (8, 4, 256, 200, 16),  # an odd number of vectors of d; a long head
])
def test_paged_prefill_attention_equals_the_causal_reference(heads, kv_heads, head_dim, window, block_size):
    if head_dim % kernels.status()["vector_width"]:
        pytest.skip("head_dim not a whole number of this build's vectors")
    g = torch.Generator().manual_seed(heads * head_dim + block_size)
    # whole prompts, chunks behind a cached prefix, one-token rows, a skipped sequence, lengths on and off the
    # chunk and tile edges
    shape = [(1, 1), (5, 5), (64, 64), (65, 65), (33, 200), (1, 300), (130, 130), (0, 40), (97, 161), (2, 2)]
    blocks = sum(-(-k // block_size) for _q, k in shape) + 8
    k_cache = torch.randn(blocks, block_size, kv_heads, head_dim, generator=g)
    v_cache = torch.randn(blocks, block_size, kv_heads, head_dim, generator=g)
    free = torch.randperm(blocks, generator=g).tolist()
    tables = [[free.pop() for _ in range(-(-k // block_size))] for _q, k in shape]
    width = max(map(len, tables)) + 1
    table_t = torch.tensor([t + [-1] * (width - len(t)) for t in tables], dtype=torch.int32)
    starts = [sum(max(n, 1) for n, _k in shape[:i]) for i in range(len(shape))]
    rows = starts[-1] + max(shape[-1][0], 1)
    bounds = [starts, [n for n, _k in shape], [k for _n, k in shape]]
    q = torch.randn(rows, heads + 2 * kv_heads, head_dim, generator=g)[:, :heads] * 3  # rows strided, as from qkv
    scale = head_dim**-0.5
    got = kernels.paged_prefill_attention(q, k_cache, v_cache, table_t, torch.tensor(bounds, dtype=torch.int32),
                                          scale, window)
    assert got is not None and got.shape == (rows, heads * head_dim)
    want = prefill_reference(q, k_cache, v_cache, tables, bounds, scale, window)
    assert len(want) == sum(n for n, _k in shape)
    for row, ref in want.items():
        torch.testing.assert_close(got[row], ref, rtol=1e-5, atol=1e-5, msg=f"row {row}")


@needs_kernels
def test_paged_prefill_attention_refuses_what_it_does_not_cover():
    q = torch.randn(4, 4, 64)
    cache = torch.randn(4, 16, 2, 64)
    tables, bounds = torch.zeros(1, 1, dtype=torch.int32), torch.tensor([[0], [4], [4]], dtype=torch.int32)
    assert kernels.paged_prefill_attention(q, cache, cache, tables, bounds, 0.1, None) is not None
    assert kernels.paged_prefill_attention(q.double(), cache, cache, tables, bounds, 0.1, None) is None
    assert kernels.paged_prefill_attention(q, cache, cache, tables.long(), bounds, 0.1, None) is None
    assert kernels.paged_prefill_attention(q, cache, cache, tables, bounds[:2].contiguous(), 0.1, None) is None
    odd = torch.randn(4, 4, 18)  # not a whole number of vectors at any width the build takes
    odd_cache = torch.randn(4, 16, 2, 18)
    assert kernels.paged_prefill_attention(odd, odd_cache, odd_cache, tables, bounds, 0.1, None) is None
    bad = torch.tensor([[0], [5], [4]], dtype=torch.int32)  # more new queries than keys
    assert kernels.paged_prefill_attention(q, cache, cache, tables, bad, 0.1, None) is None
