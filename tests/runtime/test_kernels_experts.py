"""The MoE kernels (``agents.runtime.kernels.experts``): the experts and their packed panels against the
per-token reference, the same bits for a token whatever it is batched with, and the cases they refuse."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from agents.runtime import kernels

needs_kernels = pytest.mark.skipif(not kernels.available(), reason=f"kernels not built: {kernels.status()}")


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
