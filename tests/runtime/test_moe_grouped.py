"""Routed experts as grouped GEMMs: equal to a per-expert reference over random routing, on every EP and
expert-TP split of the experts, and free of host reads of the routing."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.profiler import ProfilerActivity, profile

from agents.runtime import kernels
from agents.runtime.distributed import set_parallel_state
from agents.runtime.layers.moe import RoutedExperts

E, H, INTER = 8, 32, 24  # experts, hidden, intermediate


def full_weights(seed: int = 0) -> dict[tuple[int, str], torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    w = {}
    for e in range(E):
        w[(e, "w1")] = torch.randn(INTER, H, generator=g) * 0.2
        w[(e, "w3")] = torch.randn(INTER, H, generator=g) * 0.2
        w[(e, "w2")] = torch.randn(H, INTER, generator=g) * 0.2
    return w


def routing(tokens: int, top_k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, H, generator=g)
    ids = torch.stack([torch.randperm(E, generator=g)[:top_k] for _ in range(tokens)])  # [T, k] distinct
    weights = torch.softmax(torch.randn(tokens, top_k, generator=g), dim=-1)
    return x, weights, ids


def reference(w: dict, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Token by token, expert by expert: the plain SwiGLU sum."""
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j, e in enumerate(ids[t].tolist()):
            act = F.silu(w[(e, "w1")] @ x[t]) * (w[(e, "w3")] @ x[t])
            out[t] += weights[t, j] * (w[(e, "w2")] @ act)
    return out


def experts_of(rank: int, tp: int, ep: int, w: dict) -> RoutedExperts:
    """This rank's experts of a tp x ep stage, loaded through the checkpoint loader (no process group: the
    layout only decides which experts and which slice of each)."""
    set_parallel_state(tp, ep, rank)
    try:
        experts = RoutedExperts(E, H, INTER)
    finally:
        set_parallel_state(1, 1, 0)
    for param in (experts.w13, experts.w2):
        for shard in param.shards:
            param.weight_loader(param, w[shard], shard)
    return experts


@pytest.mark.parametrize("tp,ep", [(1, 1), (1, 2), (1, 4), (2, 1), (2, 2), (4, 2)],
                         ids=["single", "ep2", "ep4", "etp2", "tp2-ep2", "etp2-ep4"])
@pytest.mark.parametrize("tokens,top_k", [(1, 2), (5, 2), (17, 3), (64, 1)])
def test_grouped_experts_equal_per_expert_reference(tp, ep, tokens, top_k):
    w = full_weights()
    x, weights, ids = routing(tokens, top_k, seed=tokens * 10 + top_k)
    world = max(tp, ep)
    with torch.inference_mode():
        partial = sum(experts_of(rank, tp, ep, w)(x, weights, ids) for rank in range(world))
    torch.testing.assert_close(partial, reference(w, x, weights, ids), atol=1e-5, rtol=1e-5)


def test_experts_no_token_routed_to_this_rank_gives_zeros():
    w = full_weights()
    experts = experts_of(1, 1, 2, w)  # holds experts 4..7
    x = torch.randn(3, H)
    ids = torch.tensor([[0, 1], [2, 3], [1, 0]])
    with torch.inference_mode():
        out = experts(x, torch.full((3, 2), 0.5), ids)
    assert torch.equal(out, torch.zeros_like(x))


def test_experts_bfloat16_close_to_fp32():
    w = full_weights()
    x, weights, ids = routing(9, 2, seed=3)
    experts = experts_of(0, 1, 1, w)
    with torch.inference_mode():
        want = experts(x, weights, ids)
        experts.to(torch.bfloat16)
        got = experts(x.bfloat16(), weights, ids)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, atol=3e-2, rtol=3e-2)


class HostReads(TorchFunctionMode):
    """Records every tensor method or function the Python code calls that hands tensor data to the host."""

    READS = frozenset({"tolist", "item", "__bool__", "__int__", "__float__", "__index__", "nonzero", "bincount",
                       "unique", "unique_consecutive", "numpy", "masked_select", "repeat_interleave"})

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        if name in self.READS:
            self.reads.append(name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("ep_rank", [None, 1], ids=["all-experts", "ep2-rank1"])
@pytest.mark.parametrize("tokens", [1, 12])
def test_experts_forward_reads_nothing_back_to_the_host(ep_rank, tokens, monkeypatch):
    """The forward never waits on the routing's values: no ``.item()``, ``.tolist()``, ``bool(tensor)`` or
    data-dependent shape at the Python level (a torch function mode sees each), and no scalar read among
    the aten ops it issues (``aten::_local_scalar_dense``) outside the grouped GEMM kernel, whose CPU
    fallback reads its int32 group ends from host memory (on CUDA the kernel takes them on the device).
    The CPU paths (the fused kernel and the one-token loop, which read the routing: nothing to wait for on a
    CPU) are held off here, as they are on every other device and under torch.compile."""
    monkeypatch.setattr(RoutedExperts, "one_token_cpu", False)
    monkeypatch.setattr(RoutedExperts, "fused_cpu", False)
    w = full_weights()
    experts = experts_of(0, 1, 1, w) if ep_rank is None else experts_of(ep_rank, 1, 2, w)
    x, weights, ids = routing(tokens, 2, seed=5)
    with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU]) as prof, HostReads() as mode:
        experts(x, weights, ids)
    assert mode.reads == []
    events = prof.events()
    assert any(e.name == "aten::_grouped_mm" for e in events)
    inside_kernel: set[int] = set()
    stack = [c for e in events if e.name == "aten::_grouped_mm" for c in e.cpu_children]
    while stack:
        child = stack.pop()
        inside_kernel.add(child.id)
        stack.extend(child.cpu_children)
    scalar_reads = [e.name for e in events if e.id not in inside_kernel and e.name in (
        "aten::_local_scalar_dense", "aten::item", "aten::nonzero", "aten::is_nonzero")]
    assert scalar_reads == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tp,ep", [(1, 1), (1, 2)], ids=["single", "ep2"])
def test_grouped_experts_on_cuda_equal_the_cpu_reference(dtype, tp, ep):
    w = full_weights()
    x, weights, ids = routing(33, 2, seed=7)
    want = reference(w, x, weights, ids)
    with torch.inference_mode():
        got = sum(experts_of(rank, tp, ep, w).to("cuda", dtype)(x.to("cuda", dtype), weights.cuda(), ids.cuda())
                  for rank in range(max(tp, ep)))
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(got.float().cpu(), want, atol=tol, rtol=tol)


@pytest.mark.parametrize("top_k", [1, 2, 3])
def test_one_token_cpu_path_equals_the_reference_and_the_grouped_gemms(top_k, monkeypatch):
    """A single CPU token takes its k experts as matrix-vector products, added in expert order: the per-expert
    reference's sum, and the grouped path's (the same token twice, so that path runs). This is the path of a
    host without the native kernel."""
    monkeypatch.setattr(RoutedExperts, "fused_cpu", False)
    w = full_weights()
    experts = experts_of(0, 1, 1, w)
    calls: list[int] = []
    original = RoutedExperts._one_token_cpu
    monkeypatch.setattr(RoutedExperts, "_one_token_cpu", lambda self, *a: calls.append(1) or original(self, *a))
    for seed in range(4):
        x, weights, ids = routing(1, top_k, seed=seed)
        with torch.inference_mode():
            fast = experts(x, weights, ids)
            twice = experts(x.repeat(2, 1), weights.repeat(2, 1), ids.repeat(2, 1))  # grouped
        torch.testing.assert_close(fast, reference(w, x, weights, ids), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(fast, twice[:1], rtol=1e-5, atol=1e-6)
    assert len(calls) == 4  # every single token took the one-token path, no pair did


@pytest.mark.skipif(not kernels.available(), reason=f"kernels not built: {kernels.status()}")
@pytest.mark.parametrize("tokens,top_k", [(1, 2), (3, 1), (16, 2), (40, 3), (256, 1)])
def test_fused_cpu_kernel_equals_the_reference_and_the_grouped_gemms(tokens, top_k, monkeypatch):
    """On a CPU with every expert local the native kernel computes the experts (up to FUSED_MAX_ROWS rows per
    expert on average): the per-expert reference's sum, and the grouped GEMMs' to fp32 rounding."""
    w = full_weights(seed=tokens)
    experts = experts_of(0, 1, 1, w)
    x, weights, ids = routing(tokens, top_k, seed=tokens + top_k)
    calls: list[int] = []
    original = kernels.moe_experts
    monkeypatch.setattr(kernels, "moe_experts", lambda *a: calls.append(1) or original(*a))
    with torch.inference_mode():
        fused = experts(x, weights, ids)
        monkeypatch.setattr(RoutedExperts, "fused_cpu", False)
        monkeypatch.setattr(RoutedExperts, "one_token_cpu", False)
        grouped = experts(x, weights, ids)
    assert calls == [1]
    torch.testing.assert_close(fused, reference(w, x, weights, ids), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fused, grouped, rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(not kernels.available(), reason=f"kernels not built: {kernels.status()}")
@pytest.mark.parametrize("packed", [False, True])
def test_an_intermediate_split_runs_the_cpu_kernels_and_its_partial_sums_add_up_to_the_whole(monkeypatch, packed):
    """TP over the experts' intermediate size (every expert local): each rank's kernel computes its partial sum
    (its slice of gate/up and the matching columns of down), as the grouped path does; the ranks' sum is the
    whole layer's output."""
    name = "moe_panels" if packed else "moe_experts"
    calls: list[int] = []
    original = getattr(kernels, name)
    monkeypatch.setattr(kernels, name, lambda *a: (out := original(*a)) is not None and calls.append(1) or out)
    w = full_weights()
    x, weights, ids = routing(12, 2, seed=4)
    halves = [experts_of(rank, 2, 1, w) for rank in range(2)]
    if packed:
        assert all(h.pack_panels() for h in halves)
    with torch.inference_mode():
        total = sum(h(x, weights, ids) for h in halves)
    assert calls == [1, 1]
    torch.testing.assert_close(total, reference(w, x, weights, ids), rtol=1e-4, atol=1e-5)


def test_fused_cpu_kernel_steps_aside_for_long_prefills_splits_and_other_dtypes(monkeypatch):
    calls: list[int] = []  # the kernel's answers (a bfloat16 call reaches it and is refused: None)
    original = kernels.moe_experts
    monkeypatch.setattr(kernels, "moe_experts", lambda *a: (out := original(*a)) is not None and calls.append(1) or out)
    w = full_weights()
    x, weights, ids = routing(RoutedExperts.FUSED_MAX_ROWS * E // 2 + 1, 2, seed=1)  # one row over the bound
    with torch.inference_mode():
        experts_of(0, 1, 1, w)(x, weights, ids)
        sum(experts_of(rank, 1, 2, w)(x[:4], weights[:4], ids[:4]) for rank in range(2))  # EP halves
        experts_of(0, 1, 1, w).to(torch.bfloat16)(x[:4].bfloat16(), weights[:4], ids[:4])
    assert calls == []
