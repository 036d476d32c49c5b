"""The fused elementwise kernels (``agents.runtime.kernels.elementwise``: RMS norm and its fused residual add,
SiLU-and-mul, rotary in place, row argmax) against the torch code they replace, at tails that are not a multiple
of the vectors and on strided views; greedy sampling is the argmax with or without the kernel."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from agents.runtime import kernels
from agents.runtime.engine import SamplingParams
from agents.runtime.kernels import library
from agents.runtime.layers.rotary import RotaryEmbedding

needs_kernels = pytest.mark.skipif(not kernels.available(), reason=f"kernels not built: {kernels.status()}")


def ref_rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    x64 = x.double()
    return (x64 * torch.rsqrt((x64 * x64).mean(-1, keepdim=True) + eps) * w.double()).float()


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
