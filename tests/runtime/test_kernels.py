"""The fused fp32 CPU kernels (``agents/runtime/kernels``) against the torch code they replace: each kernel over
shapes that stress its edges (tails that are not a multiple of the vectors, strided views, GQA groups,
sliding windows, scattered block tables), the engine's greedy tokens with the kernels on and off, and the
fallbacks (turned off, a failing build, cases a kernel does not cover). The whole file runs again for every
narrower vector width the host can build (AVX2 and SSE code on an AVX-512 host)."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from agents.runtime import kernels
from agents.runtime.engine import LLMEngine, SamplingParams
from agents.runtime.kernels import build, library
from agents.runtime.layers.rotary import RotaryEmbedding
from agents.runtime.testing.make_model import cached_model

needs_kernels = pytest.mark.skipif(not kernels.available(), reason=f"kernels not built: {kernels.status()}")


@pytest.fixture
def kernels_off(monkeypatch):
    """The layers' torch code, as on a host where the library is not built."""
    monkeypatch.setattr(library, "state", "unavailable")


def ref_rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    x64 = x.double()
    return (x64 * torch.rsqrt((x64 * x64).mean(-1, keepdim=True) + eps) * w.double()).float()


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler")
def test_the_library_builds_and_loads_where_a_compiler_is():
    status = kernels.status()
    assert status["loaded"] and status["reason"] is None and status["vector_width"] in (4, 8, 16)


def _cpu_flags() -> set[str]:
    try:
        return {f for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")
                for f in line.split(":", 1)[1].split()}
    except OSError:
        return set()


NARROWER = {  # compiler flags -> the width they build, where the host has a wider one
    8: "-mno-avx512f",
    4: "-mno-avx512f -mno-avx2 -mno-fma -mno-avx",
}


@needs_kernels
@pytest.mark.skipif(os.environ.get("DAY0_KERNEL_CFLAGS") is not None, reason="already a narrower build")
@pytest.mark.skipif(platform.machine() != "x86_64", reason="x86-64 widths")
@pytest.mark.parametrize("width", [pytest.param(4, marks=pytest.mark.slow), 8])  # SSE / NEON-sized: rarer hosts
def test_every_kernel_at_a_narrower_vector_width(width, tmp_path):
    """A hypervisor or an older core can hide AVX-512 (or AVX2): the same source built for that width passes
    this whole file. Built into its own cache here, from the host's flags minus the wider units."""
    have = kernels.status()["vector_width"]
    if width >= have or (width == 8 and "avx2" not in _cpu_flags()):
        pytest.skip(f"the host's own build is {have} lanes")
    env = {**os.environ, "DAY0_KERNEL_CFLAGS": NARROWER[width], "DAY0_KERNEL_CACHE": str(tmp_path / "cache")}
    probe = subprocess.run([sys.executable, "-c", "from agents.runtime import kernels; print(kernels.status())"],
                           env=env, capture_output=True, text=True, timeout=300)
    assert f"'vector_width': {width}" in probe.stdout, probe.stdout + probe.stderr
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", __file__],
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and " failed" not in run.stdout


@needs_kernels
@pytest.mark.parametrize("rows,cols", [(1, 768), (7, 33), (300, 200)])
def test_rms_norm_and_the_fused_residual_add(rows, cols):
    g = torch.Generator().manual_seed(rows * cols)
    x, d = torch.randn(rows, cols, generator=g) * 3, torch.randn(rows, cols, generator=g)
    w = torch.randn(cols, generator=g)
    torch.testing.assert_close(kernels.rms_norm(x, w, 1e-6), ref_rms(x, w, 1e-6), rtol=1e-5, atol=1e-5)
    h, normed = kernels.add_rms_norm(x, d, w, 1e-5)
    torch.testing.assert_close(h, x + d, rtol=0, atol=0)
    torch.testing.assert_close(normed, ref_rms(x + d, w, 1e-5), rtol=1e-5, atol=1e-5)


@needs_kernels
def test_rms_norm_of_a_strided_view_of_heads():
    qkv = torch.randn(5, 6 * 32)
    heads = qkv.view(5, 6, 32)[:, 1:4]  # [5, 3, 32]: rows strided by 192, heads by 32
    w = torch.randn(32)
    out = kernels.rms_norm(heads, w, 1e-6)
    assert out.is_contiguous() and out.shape == (5, 3, 32)
    torch.testing.assert_close(out, ref_rms(heads, w, 1e-6), rtol=1e-5, atol=1e-5)


@needs_kernels
@pytest.mark.parametrize("inter", [16, 37, 2048])
def test_silu_and_mul_over_the_whole_float_range(inter):
    x = torch.randn(9, 2 * inter) * 8
    x[0, :6] = torch.tensor([-200.0, -88.0, -20.0, 0.0, 20.0, 90.0])  # saturated and tiny exponentials
    gate, up = x.chunk(2, dim=-1)
    torch.testing.assert_close(kernels.silu_and_mul(x), F.silu(gate) * up, rtol=2e-6, atol=1e-6)


@needs_kernels
@pytest.mark.parametrize("head_dim,partial", [(64, 1.0), (80, 1.0), (64, 0.5)])
def test_rotary_in_place_equals_the_reference(head_dim, partial):
    config = {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                  "partial_rotary_factor": partial}, "max_position_embeddings": 8192}
    rope = RotaryEmbedding(head_dim, config)
    tokens, heads, kv_heads = 6, 4, 2
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim)
    qk = qkv[:, : (heads + kv_heads) * head_dim].view(tokens, heads + kv_heads, head_dim)  # a strided view
    cos, sin = rope.cos_sin(torch.tensor([0, 1, 5, 100, 3000, 8000]), 8001, torch.float32)
    want = rope.rotate(qk.clone(), cos, sin)
    v_before = qkv[:, (heads + kv_heads) * head_dim :].clone()
    assert rope.rotate_(qk, cos, sin) is qk  # in place
    torch.testing.assert_close(qk, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(qkv[:, (heads + kv_heads) * head_dim :], v_before, rtol=0, atol=0)  # V untouched


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


@needs_kernels
@pytest.mark.parametrize("rows,cols", [(1, 7), (16, 32000), (3, 33)])
def test_argmax_rows_keeps_torchs_first_maximum(rows, cols):
    x = torch.randn(rows, cols)
    x[0, : min(3, cols)] = 1e4  # a tie: the first index wins, as in torch
    if rows > 2:
        x[1] = float("-inf")  # all -inf: index 0
        x[2, -1] = float("inf")
    assert kernels.argmax_rows(x) == x.argmax(-1).tolist()
    x[rows - 1, cols // 2] = float("nan")
    assert kernels.argmax_rows(x) is None  # a NaN row: torch decides (it picks the NaN)


def test_greedy_sampling_is_the_argmax_with_or_without_the_kernel(monkeypatch):
    from agents.runtime.engine.sampler import sample
    from agents.runtime.engine.sequence import Sequence

    logits = torch.randn(5, 300)
    logits[1, 10] = logits[1, 20] = 99.0
    seqs = [Sequence(f"r{i}", [1, 2], SamplingParams(temperature=0.0)) for i in range(5)]
    want = logits.argmax(-1).tolist()
    assert sample(logits, seqs) == want and want[1] == 10
    monkeypatch.setattr(library, "state", "unavailable")
    assert sample(logits, seqs) == want
    nan = logits.clone()
    nan[2, 5] = float("nan")
    monkeypatch.setattr(library, "state", "loaded")
    assert sample(nan, seqs)[2] == nan.argmax(-1).tolist()[2]


def test_cases_the_kernels_do_not_cover_fall_back():
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    assert kernels.rms_norm(x, torch.ones(64, dtype=torch.bfloat16), 1e-6) is None
    assert kernels.silu_and_mul(torch.randn(4, 64).t()) is None  # not contiguous
    assert kernels.rms_norm(torch.randn(2, 3, 4, 8), torch.ones(8), 1e-6) is None  # 4 dims
    q = torch.randn(2, 4, 1024)  # head_dim beyond the kernel's buffers
    cache = torch.randn(4, 16, 4, 1024)
    lens, tables = torch.tensor([3, 5], dtype=torch.int32), torch.zeros(2, 1, dtype=torch.int32)
    assert kernels.paged_decode_attention(q, cache, cache, tables, lens, 0.1, None) is None
    assert kernels.paged_decode_attention(q[..., :64], cache[..., :64].contiguous(), cache[..., :64].contiguous(),
                                          tables.long(), lens, 0.1, None) is None  # int64 tables


def ref_moe(x, w13, w2, ids, weights):
    """Token by token, its experts in ascending order, in float64."""
    inter = w13.shape[1] // 2
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in sorted(range(ids.shape[1]), key=lambda j: int(ids[t, j])):
            e = int(ids[t, j])
            h = w13[e].double() @ x[t].double()
            act = F.silu(h[:inter]) * h[inter:]
            out[t] += float(weights[t, j]) * (w2[e].double() @ act)
    return out.float()


@needs_kernels
@pytest.mark.parametrize("tokens,experts,top_k,hidden,inter", [
    (1, 8, 2, 768, 512),  # the 100M Qwen3-MoE's shapes
    (5, 4, 4, 33, 17),  # every expert for every token; tails everywhere (not a multiple of 16 or of 4 rows)
    (70, 3, 1, 48, 40),  # more than 64 rows for one expert (the kernel's row chunks)
    (9, 16, 2, 64, 96),  # most experts idle
])
def test_moe_experts_equals_the_per_token_reference(tokens, experts, top_k, hidden, inter):
    g = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, hidden, generator=g)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=g) / hidden ** 0.5
    w2 = torch.randn(experts, hidden, inter, generator=g) / inter ** 0.5
    ids = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(tokens)])
    if tokens == 70:
        ids[:] = 1  # one expert takes every row
    weights = torch.softmax(torch.randn(tokens, top_k, generator=g), -1)
    got = kernels.moe_experts(x, w13, w2, ids, weights)
    torch.testing.assert_close(got, ref_moe(x, w13, w2, ids, weights), rtol=1e-5, atol=2e-5)


def _moe_case(tokens, experts, top_k, hidden, inter, seed=0):
    g = torch.Generator().manual_seed(seed or tokens)
    x = torch.randn(tokens, hidden, generator=g)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=g) / hidden ** 0.5
    w2 = torch.randn(experts, hidden, inter, generator=g) / inter ** 0.5
    ids = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(tokens)])
    weights = torch.softmax(torch.randn(tokens, top_k, generator=g), -1)
    return x, w13, w2, ids, weights


@needs_kernels
@pytest.mark.parametrize("tokens,experts,top_k,hidden,inter", [
    (1, 8, 2, 768, 512),  # the 100M Qwen3-MoE's shapes, decode
    (5, 4, 4, 33, 17),  # every expert for every token; tails everywhere
    (300, 3, 1, 48, 40),  # one expert takes every row: 19 tiles in several L2 segments
    (9, 16, 2, 64, 96),  # most experts idle
    (40, 2, 2, 20, 1),  # one intermediate channel
])
def test_moe_panels_equals_the_per_token_reference(tokens, experts, top_k, hidden, inter):
    x, w13, w2, ids, weights = _moe_case(tokens, experts, top_k, hidden, inter)
    if tokens == 300:
        ids[:] = 1
    packed = kernels.pack_expert_panels(w13, w2)
    assert packed is not None
    w13p, w2p = packed
    assert w13p.shape == (experts, 2 * -(-inter // 16), hidden, 16) and w2p.shape == (experts, -(-hidden // 16), inter, 16)
    back = kernels.unpack_expert_panels(w13p, w2p, inter)
    assert torch.equal(back[0], w13) and torch.equal(back[1], w2)  # the panels hold exactly the weights
    got = kernels.moe_panels(x, w13p, w2p, inter, ids, weights)
    torch.testing.assert_close(got, ref_moe(x, w13, w2, ids, weights), rtol=1e-5, atol=2e-5)


@needs_kernels
def test_moe_panels_gives_a_token_the_same_bits_whatever_it_is_batched_with():
    x, w13, w2, ids, weights = _moe_case(64, 8, 2, 96, 80, seed=3)
    w13p, w2p = kernels.pack_expert_panels(w13, w2)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        batched = kernels.moe_panels(x, w13p, w2p, 80, ids, weights)
        torch.set_num_threads(1)
        assert torch.equal(kernels.moe_panels(x, w13p, w2p, 80, ids, weights), batched)
    finally:
        torch.set_num_threads(threads)
    for t in (0, 17, 63):
        alone = kernels.moe_panels(x[t:t + 1].contiguous(), w13p, w2p, 80, ids[t:t + 1].contiguous(),
                                   weights[t:t + 1].contiguous())
        assert torch.equal(alone[0], batched[t])


@needs_kernels
def test_moe_panels_refuses_what_it_does_not_cover():
    x, w13, w2, ids, weights = _moe_case(2, 4, 2, 16, 4)
    w13p, w2p = kernels.pack_expert_panels(w13, w2)
    assert kernels.moe_panels(x, w13p, w2p, 4, ids, weights) is not None
    assert kernels.moe_panels(x, w13p, w2p, 4, torch.tensor([[0, 4], [2, 3]]), weights) is None  # id out of range
    assert kernels.moe_panels(x, w13p, w2p, 20, ids, weights) is None  # not these panels' intermediate size
    assert kernels.moe_panels(x.double(), w13p, w2p, 4, ids, weights) is None
    assert kernels.moe_panels(x, w13p, w2p, 4, ids.int(), weights) is None
    assert kernels.pack_expert_panels(w13[:, :7], w2) is None  # odd gate/up rows
    assert kernels.pack_expert_panels(w13.transpose(1, 2), w2) is None


@needs_kernels
def test_moe_experts_refuses_what_it_does_not_cover():
    x, w13, w2 = torch.randn(2, 16), torch.randn(4, 8, 16), torch.randn(4, 16, 4)
    weights = torch.full((2, 2), 0.5)
    ok = torch.tensor([[0, 1], [2, 3]])
    assert kernels.moe_experts(x, w13, w2, ok, weights) is not None
    assert kernels.moe_experts(x, w13, w2, torch.tensor([[0, 4], [2, 3]]), weights) is None  # id out of range
    assert kernels.moe_experts(x, w13, w2, torch.tensor([[0, -1], [2, 3]]), weights) is None
    assert kernels.moe_experts(x, w13, w2, ok.int(), weights) is None  # int32 ids
    assert kernels.moe_experts(x.double(), w13.double(), w2.double(), ok, weights) is None
    assert kernels.moe_experts(x, w13, torch.randn(4, 16, 5), ok, weights) is None  # w2 of another width
    assert kernels.moe_experts(x, w13.transpose(1, 2).contiguous().transpose(1, 2), w2, ok, weights) is None


@needs_kernels
@pytest.mark.parametrize("rows,out,inner", [(1, 1, 1), (1, 33, 70), (2, 16, 64), (3, 77, 5), (16, 48, 300),
                                            (17, 100, 257), (40, 31, 768), (129, 64, 513), (5, 20, 0)])
@pytest.mark.parametrize("bias", [False, True])
def test_panel_linear_equals_the_product_at_every_tail(rows, out, inner, bias):
    """Tails of every kind: one row, a partial 16-row tile, more than one tile, an output count that leaves the
    last panel partly padding, K past one K block and not a multiple of 16, K = 0."""
    torch.manual_seed(rows * 1000 + out + inner)
    w, x = torch.randn(out, inner), torch.randn(rows, inner)
    b = torch.randn(out) if bias else None
    wp = kernels.pack_panels(w)
    assert wp.shape == (-(-out // kernels.PANEL), inner, kernels.PANEL)
    y = kernels.panel_linear(x, wp, out, b)
    want = F.linear(x.double(), w.double(), None if b is None else b.double())
    assert y.shape == (rows, out)
    assert torch.allclose(y.double(), want, atol=1e-4 * max(1, inner) ** 0.5, rtol=1e-5)


@needs_kernels
def test_panel_linear_gives_a_row_the_same_bits_whatever_it_is_batched_with():
    """Each output is one multiply-add chain over k in order: a row alone, in a batch of 16, in a batch of 300
    (K blocked), strided, on one thread or two: the same bits."""
    torch.manual_seed(3)
    w, x = torch.randn(200, 640), torch.randn(300, 640)
    wp = kernels.pack_panels(w)
    batch = kernels.panel_linear(x, wp, 200)
    wide = torch.randn(300, 1000)
    wide[:, 100:740] = x
    assert torch.equal(kernels.panel_linear(wide[:, 100:740], wp, 200), batch)  # rows strided
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            assert torch.equal(kernels.panel_linear(x[:16].contiguous(), wp, 200), batch[:16])
            for i in (0, 7, 299):
                assert torch.equal(kernels.panel_linear(x[i:i + 1].contiguous(), wp, 200), batch[i:i + 1])
    finally:
        torch.set_num_threads(threads)


@needs_kernels
def test_panel_linear_refuses_what_it_does_not_cover():
    w, x = torch.randn(40, 24), torch.randn(3, 24)
    wp = kernels.pack_panels(w)
    assert kernels.panel_linear(x, wp, 40) is not None
    assert kernels.panel_linear(x, wp, 49) is None  # more outputs than the panels hold
    assert kernels.panel_linear(x, wp, 32) is None  # a whole panel of padding: not this weight's panels
    assert kernels.panel_linear(torch.randn(3, 25), wp, 40) is None  # K of another width
    assert kernels.panel_linear(x.double(), wp, 40) is None
    assert kernels.panel_linear(x.t().contiguous().t(), wp, 40) is None  # columns strided
    assert kernels.panel_linear(x, wp, 40, torch.randn(41)) is None  # bias of another length
    assert kernels.pack_panels(w.double()) is None and kernels.pack_panels(w.t()) is None


def test_panel_packed_weights_run_their_torch_code_where_the_kernel_does_not(kernels_off, monkeypatch):
    """With the library out of reach (or a dispatch mode tracing), a panel-packed weight's product is computed
    by torch ops, to the same values."""
    from agents.runtime.layers import linear

    torch.manual_seed(5)
    w, x, b = torch.randn(40, 24), torch.randn(6, 24), torch.randn(40)
    panels = torch.zeros(48, 24)
    panels[:40] = w
    packed = torch.nn.Parameter(panels.view(3, 16, 24).transpose(1, 2).contiguous(), requires_grad=False)
    packed.panel_rows = 40
    assert torch.allclose(linear.dense_linear(x, packed, b), F.linear(x, w, b), atol=1e-5)


PROMPTS = [[5, 9, 11], list(range(20, 77)), [7] * 40, [3]]
PARAMS = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)


@needs_kernels
@pytest.mark.parametrize("arch", ["llama", "qwen3", "qwen3-moe", "mixtral"])
def test_engine_greedy_tokens_equal_with_and_without_kernels(arch, monkeypatch):
    path = cached_model(arch)
    fused = [o.output_token_ids for o in LLMEngine(path, num_blocks=64, block_size=4).generate(PROMPTS, PARAMS)]
    monkeypatch.setattr(library, "state", "unavailable")
    plain = [o.output_token_ids for o in LLMEngine(path, num_blocks=64, block_size=4).generate(PROMPTS, PARAMS)]
    assert fused == plain


@needs_kernels
def test_engine_logits_close_with_and_without_kernels(monkeypatch):
    """Beyond the argmax: the decode logits of a mixed batch agree to fp32 rounding."""
    path = cached_model("llama")
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=5)

    def logprobs() -> list[float]:
        engine = LLMEngine(path, num_blocks=64, block_size=4)
        ids = [engine.add_request(p, params) for p in PROMPTS]
        got: dict[str, list[float]] = {i: [] for i in ids}
        while engine.has_unfinished():
            for out in engine.step():
                got[out.request_id] += [v for lp in out.new_logprobs or [] for v in (lp.logprob, *dict(lp.top).values())]
        return [v for i in ids for v in got[i]]

    fused = logprobs()
    assert len(fused) == len(PROMPTS) * 6 * 6  # each token: its logprob and the top 5
    monkeypatch.setattr(library, "state", "unavailable")
    torch.testing.assert_close(torch.tensor(fused), torch.tensor(logprobs()), rtol=1e-4, atol=1e-4)


def _reset(monkeypatch):
    monkeypatch.setattr(library, "state", "unloaded")
    monkeypatch.setattr(library, "lib", None)
    monkeypatch.setattr(library, "reason", "")


def test_turned_off_by_the_environment(monkeypatch):
    _reset(monkeypatch)
    monkeypatch.setenv("DAY0_NATIVE_KERNELS", "0")
    assert not kernels.available()
    assert kernels.status() == {"loaded": False, "reason": "turned off by DAY0_NATIVE_KERNELS", "vector_width": None}
    assert kernels.silu_and_mul(torch.randn(2, 8)) is None


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler")
def test_a_failing_build_is_said_once_and_the_torch_code_runs(monkeypatch, tmp_path, caplog):
    _reset(monkeypatch)
    broken = tmp_path / "broken.c"
    broken.write_text("int day0_abi_version(void) { return 1 }\n")  # a syntax error
    monkeypatch.setattr(build, "SOURCE", broken)
    monkeypatch.setenv("DAY0_KERNEL_CACHE", str(tmp_path / "cache"))
    assert not kernels.available()
    reason = kernels.status()["reason"]
    assert "failed" in reason and "broken.c" in reason
    assert "native CPU kernels unavailable" in caplog.text
    engine = LLMEngine(cached_model("llama"), num_blocks=32)
    assert len(engine.generate([[5, 6, 7]], SamplingParams(max_tokens=3, temperature=0.0))[0].output_token_ids) == 3
    assert not list((tmp_path / "cache").glob("*.so"))  # nothing half-written left behind


@needs_kernels
def test_a_dispatch_mode_sees_the_models_own_aten_ops():
    """The operator inventory traces with a dispatch mode: under one, the kernels step aside."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: set[str] = set()

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.add(str(func))
            return func(*args, **(kwargs or {}))

    x = torch.randn(4, 64)
    assert kernels.silu_and_mul(x) is not None  # no mode: the kernel
    with Record():
        assert kernels.silu_and_mul(x) is None
        engine = LLMEngine(cached_model("llama"), num_blocks=32, block_size=4)
        engine.generate([[5, 6, 7]], SamplingParams(max_tokens=3, temperature=0.0))
    assert {"aten.silu.default", "aten.rsqrt.default", "aten.argmax.default"} <= seen


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler")
def test_a_new_build_prunes_libraries_unused_for_a_month(monkeypatch, tmp_path):
    _reset(monkeypatch)
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("DAY0_KERNEL_CACHE", str(cache))
    stale, recent, other = (cache / "day0_cpu_kernels-stale.so", cache / "day0_cpu_kernels-recent.so",
                            cache / "notes.txt")
    for path in (stale, recent, other):
        path.write_bytes(b"x")
    month_ago = time.time() - (build.PRUNE_DAYS + 1) * 86400
    os.utime(stale, (month_ago, month_ago))
    os.utime(other, (month_ago, month_ago))
    assert kernels.available()
    left = sorted(p.name for p in cache.iterdir())
    assert "day0_cpu_kernels-stale.so" not in left and {"day0_cpu_kernels-recent.so", "notes.txt"} <= set(left)
    assert len([n for n in left if n.endswith(".so")]) == 2  # the new library and the recent one
