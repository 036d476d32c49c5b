"""The MoE block with shared experts, layer by layer: a naive per-token reference, then TP=2, EP=2 and both
over 2 gloo processes (expert weights loaded through their (expert_id, shard) weight loaders)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from agents.runtime.distributed import launch, set_parallel_state
from agents.runtime.layers.mlp import SwiGLUMLP
from agents.runtime.layers.moe import MoEBlock, RoutedExperts, TopKRouter

H, INTER, I_SHARED, E, K = 16, 24, 32, 4, 2


def _weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    w = {"router": torch.randn(E, H, generator=g)}
    for e in range(E):
        w[f"{e}.w1"] = torch.randn(INTER, H, generator=g) * 0.2
        w[f"{e}.w3"] = torch.randn(INTER, H, generator=g) * 0.2
        w[f"{e}.w2"] = torch.randn(H, INTER, generator=g) * 0.2
    w["gate"] = torch.randn(I_SHARED, H, generator=g) * 0.2
    w["up"] = torch.randn(I_SHARED, H, generator=g) * 0.2
    w["down"] = torch.randn(H, I_SHARED, generator=g) * 0.2
    w["x"] = torch.randn(6, H, generator=g)
    return w


def _load(p: torch.nn.Parameter, tensor: torch.Tensor, shard=None) -> None:
    p.weight_loader(p, tensor, shard)


def block_outputs(renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Outputs for a 6-token batch and for its first token alone (the batch-1 path)."""
    w = _weights()
    shared = SwiGLUMLP(H, I_SHARED, reduce_results=False)
    block = MoEBlock(TopKRouter(H, E, K, renormalize), RoutedExperts(E, H, INTER), shared)
    _load(block.gate.weight, w["router"])
    for e in range(E):
        for which in ("w1", "w3"):
            _load(block.experts.w13, w[f"{e}.{which}"], (e, which))
        _load(block.experts.w2, w[f"{e}.w2"], (e, "w2"))
    _load(shared.gate_up_proj.weight, w["gate"], 0)
    _load(shared.gate_up_proj.weight, w["up"], 1)
    _load(shared.down_proj.weight, w["down"])
    with torch.no_grad():
        return block(w["x"]), block(w["x"][:1])


def _naive(renormalize: bool) -> torch.Tensor:
    w = _weights()
    out = []
    for x in w["x"]:
        probs = torch.softmax(w["router"] @ x, -1)
        top, ids = torch.topk(probs, K)
        if renormalize:
            top = top / top.sum()
        y = sum(t * (w[f"{e}.w2"] @ (F.silu(w[f"{e}.w1"] @ x) * (w[f"{e}.w3"] @ x))) for t, e in zip(top, ids.tolist(), strict=True))
        y = y + w["down"] @ (F.silu(w["gate"] @ x) * (w["up"] @ x))
        out.append(y)
    return torch.stack(out)


@pytest.mark.parametrize("renormalize", [True, False])
def test_single_process_block_matches_naive_reference(renormalize):
    batch, one = block_outputs(renormalize)
    expected = _naive(renormalize)
    torch.testing.assert_close(batch, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(one, expected[:1], atol=1e-5, rtol=1e-5)


LAYOUTS = [(2, 1), (1, 2), (2, 2)]


def all_layouts() -> dict:
    """Every layout in one pair of processes (the world group serves them all)."""
    rank = torch.distributed.get_rank()
    out = {}
    for tp, ep in LAYOUTS:
        set_parallel_state(tp, ep, rank)
        out[(tp, ep)] = block_outputs(False)
    return out


@pytest.fixture(scope="module")
def parallel() -> list[dict]:
    return launch(all_layouts, 2)


@pytest.mark.parametrize("tp,ep", LAYOUTS, ids=["tp2", "ep2", "tp2-ep2"])
def test_parallel_block_matches_single_process(parallel, tp, ep):
    batch, one = block_outputs(False)
    for rank_out in parallel:
        rank_batch, rank_one = rank_out[(tp, ep)]
        torch.testing.assert_close(rank_batch, batch, atol=1e-5, rtol=0)
        torch.testing.assert_close(rank_one, one, atol=1e-5, rtol=0)
