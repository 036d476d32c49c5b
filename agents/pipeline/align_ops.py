"""Operator alignment (the ``align.ops`` list): each operator the model relies on, on fixed random inputs (seed
0), computed by a float32 reference on CPU and by the target implementation on ``ctx.device`` in ``ctx.dtype``.

Inputs are drawn in float32 on CPU, rounded once to the target dtype, and both sides start from those rounded
values: the comparison measures the operator, not the rounding of its inputs.

Metrics per operator, over the whole output tensor (``a`` reference, ``b`` target, both float64):

* ``cosine``: ``<a, b> / (|a| |b|)`` of the flattened tensors;
* ``max_abs_err``: ``max |a - b|``;
* ``max_rel_err``: ``max |a - b| / max(max |a|, eps)`` — the largest error relative to the reference's largest
  magnitude (a normwise definition: elementwise ratios explode where the reference is near zero).

MoE routing also reports ``topk_agreement``: the share of tokens whose top-k expert set is the same on both
sides; a disagreement on a token whose reference k-th and (k+1)-th probabilities are within ``near_tie_margin``
is a near-tie and does not fail the check.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from agents.pipeline.base import StageContext, StageFailed
from agents.pipeline.thresholds import OPS as OP_THRESHOLDS

DEFAULT_THRESHOLDS: dict[str, float] = OP_THRESHOLDS
TOKENS = 32
_MAX_HIDDEN = 1024
_MAX_INTERMEDIATE = 2048
_EPS = 1e-12


@dataclass(frozen=True)
class OpShapes:
    """Operator sizes taken from the model's config, capped so the check stays quick on any host."""

    tokens: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    experts: int
    top_k: int
    rope_theta: float
    rms_eps: float

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> OpShapes:
        hidden = min(int(config.get("hidden_size") or 256), _MAX_HIDDEN)
        heads = max(1, int(config.get("num_attention_heads") or 4))
        head_dim = int(config.get("head_dim") or (int(config.get("hidden_size") or 256) // heads))
        heads = max(1, min(heads, hidden // max(head_dim, 1)))  # keep heads × head_dim within the capped hidden
        kv_heads = max(1, min(int(config.get("num_key_value_heads") or heads), heads))
        while heads % kv_heads:
            kv_heads -= 1
        experts = int(config.get("num_local_experts") or config.get("num_experts") or config.get("n_routed_experts") or 0)
        inter = config.get("moe_intermediate_size") if experts else None
        inter = int(inter or config.get("intermediate_size") or 4 * hidden)
        return cls(
            tokens=TOKENS,
            hidden=hidden,
            intermediate=min(inter, _MAX_INTERMEDIATE),
            heads=heads,
            kv_heads=kv_heads,
            head_dim=head_dim,
            experts=min(experts, 64),
            top_k=min(int(config.get("num_experts_per_tok") or 2), max(experts, 1)),
            rope_theta=float(config.get("rope_theta") or (config.get("rope_parameters") or {}).get("rope_theta") or 1e4),
            rms_eps=float(config.get("rms_norm_eps") or 1e-6),
        )


def compare(ref: torch.Tensor, out: torch.Tensor) -> dict[str, float]:
    """Cosine, max absolute and max (normwise) relative error of ``out`` against ``ref``."""
    if ref.shape != out.shape:
        raise StageFailed(f"shape mismatch: reference {tuple(ref.shape)} vs target {tuple(out.shape)}")
    a = ref.detach().to("cpu", torch.float64).flatten()
    b = out.detach().to("cpu", torch.float64).flatten()
    if not torch.isfinite(b).all():
        return {"cosine": float("nan"), "max_rel_err": float("inf"), "max_abs_err": float("inf")}
    diff = (a - b).abs().max().item() if a.numel() else 0.0
    denom = a.norm().item() * b.norm().item()
    cosine = (a @ b).item() / denom if denom > 0 else (1.0 if diff == 0 else 0.0)
    return {"cosine": cosine, "max_rel_err": diff / max(a.abs().max().item(), _EPS), "max_abs_err": diff}


# ---------------------------------------------------------------- references (float32, written out)


def _matmul(t: dict[str, torch.Tensor]) -> torch.Tensor:
    return t["x"] @ t["w_mm"].T  # [T, I]


def _rms_norm_ref(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w  # [T, hidden]


def _rope_ref(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, scaling: float) -> torch.Tensor:
    """Non-interleaved RoPE on the first ``2 * len(inv_freq)`` channels of x [T, H, D], angles in float64."""
    rot = 2 * inv_freq.shape[0]
    angles = positions.double()[:, None] * inv_freq.double()[None]  # [T, rot/2]
    cos, sin = (angles.cos() * scaling).float()[:, None], (angles.sin() * scaling).float()[:, None]  # [T, 1, rot/2]
    x1, x2 = x[..., : rot // 2], x[..., rot // 2 : rot]
    out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)  # [T, H, rot]
    return torch.cat([out, x[..., rot:]], -1)


def _attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal GQA attention written out: q [T, H, D], k/v [T, KVH, D] -> [T, H * D]."""
    t, h, d = q.shape
    rep = h // k.shape[1]
    k = k.repeat_interleave(rep, dim=1)  # [T, H, D]
    v = v.repeat_interleave(rep, dim=1)
    scores = torch.einsum("thd,shd->hts", q, k) / math.sqrt(d)  # [H, T, T]
    mask = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.einsum("hts,shd->thd", scores.softmax(-1), v).flatten(1)  # [T, H * D]


def _experts_ref(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, idx: torch.Tensor,
                 w: torch.Tensor) -> torch.Tensor:
    """SwiGLU experts: x [T, hidden], gate_up [E, 2I, hidden], down [E, hidden, I], idx/w [T, k] -> [T, hidden]."""
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(idx.shape[1]):
            e = int(idx[t, j])
            gate, up = (gate_up[e] @ x[t]).chunk(2)  # [I] each
            out[t] += w[t, j] * (down[e] @ (F.silu(gate) * up))
    return out


def _route_ref(x: torch.Tensor, router: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    probs = (x @ router.T).softmax(-1)  # [T, E]
    weights, idx = probs.topk(k, -1)  # [T, k]
    return probs, weights / weights.sum(-1, keepdim=True), idx


# ---------------------------------------------------------------- targets (the runtime's own layers)


def _module(module: torch.nn.Module, params: dict[str, torch.Tensor], device: str, dtype: torch.dtype) -> Any:
    with torch.no_grad():
        for name, value in params.items():
            getattr(module, name).data = value.to(device, dtype)
    return module.to(device)


class RuntimeTargets:
    """The runtime layers (``agents/runtime/layers``) run on the target device and dtype."""

    def __init__(self, s: OpShapes, config: dict[str, Any], device: str, dtype: torch.dtype) -> None:
        from agents.runtime.layers import rotary

        self.s, self.device, self.dtype = s, device, dtype
        rope_config = {**config, "rope_theta": s.rope_theta} if "rope_theta" not in config else config
        self.rope = rotary.RotaryEmbedding(s.head_dim, rope_config).to(device)
        self.inv_freq = self.rope.inv_freq.detach().cpu().float()
        self.rope_scaling = float(self.rope.scaling)

    def rms_norm(self, t: dict[str, torch.Tensor]) -> torch.Tensor:
        from agents.runtime.layers.norm import RMSNorm

        return _module(RMSNorm(self.s.hidden, self.s.rms_eps), {"weight": t["w_norm"]}, self.device, self.dtype)(t["x"])

    def rope_q(self, t: dict[str, torch.Tensor]) -> torch.Tensor:
        q, _ = self.rope(t["positions"], t["q"], t["q"])
        return q  # [T, H, D]

    def attention(self, t: dict[str, torch.Tensor]) -> torch.Tensor:
        from agents.runtime.context import ForwardContext
        from agents.runtime.layers.attention import Attention, AttentionMetadata

        ctx = ForwardContext.for_prompts([self.s.tokens], device=self.device)
        layer = Attention(self.s.heads, self.s.kv_heads, self.s.head_dim, scale=self.s.head_dim**-0.5)
        return layer(t["q"], t["k"], t["v"], AttentionMetadata.build(ctx))  # [T, H * D]

    def silu(self, t: dict[str, torch.Tensor]) -> torch.Tensor:
        from agents.runtime.layers.mlp import silu_and_mul

        return silu_and_mul(torch.cat([t["x"], t["x"].flip(-1)], -1))  # [T, hidden]

    def route(self, t: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        from agents.runtime.layers.moe import TopKRouter

        router = TopKRouter(self.s.hidden, t["router"].shape[0], self.s.top_k, renormalize=True)
        return _module(router, {"weight": t["router"]}, self.device, self.dtype)(t["x"])  # weights, ids: [T, k]

    def experts(self, t: dict[str, torch.Tensor], weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        from agents.runtime.layers.moe import FusedExperts

        layer = FusedExperts(t["gate_up"].shape[0], self.s.hidden, self.s.intermediate)
        layer = _module(layer, {"w13": t["gate_up"], "w2": t["down"]}, self.device, self.dtype)
        return layer(t["x"], weights, ids)  # [T, hidden]


# ---------------------------------------------------------------- the checks


def _inputs(s: OpShapes, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * scale

    e = max(s.experts, 1)
    return {
        "x": rnd(s.tokens, s.hidden),
        "w_mm": rnd(s.intermediate, s.hidden, scale=s.hidden**-0.5),
        "w_norm": 1.0 + 0.1 * rnd(s.hidden),
        "q": rnd(s.tokens, s.heads, s.head_dim),
        "k": rnd(s.tokens, s.kv_heads, s.head_dim),
        "v": rnd(s.tokens, s.kv_heads, s.head_dim),
        "logits": rnd(s.tokens, 4 * s.hidden, scale=3.0),
        "router": rnd(e, s.hidden, scale=s.hidden**-0.5),
        "gate_up": rnd(e, 2 * s.intermediate, s.hidden, scale=s.hidden**-0.5),
        "down": rnd(e, s.hidden, s.intermediate, scale=s.intermediate**-0.5),
        "positions": torch.arange(s.tokens) * 97 % 4096,  # spread positions to exercise large angles
    }


def run_checks(
    config: dict[str, Any], *, device: str = "cpu", dtype: str = "float32", thresholds: dict[str, float] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[dict[str, Any]]:
    """The ``align.ops`` entries for a model config on ``device`` / ``dtype``."""
    th = {**DEFAULT_THRESHOLDS, **(thresholds or {})}
    torch_dtype = getattr(torch, dtype, None)
    if not isinstance(torch_dtype, torch.dtype) or not torch_dtype.is_floating_point:
        raise StageFailed(f"dtype {dtype!r} is not a floating-point torch dtype")
    s = OpShapes.from_config(config)
    ins = _inputs(s)
    ref_in = {k: (v.to(torch_dtype).float() if v.is_floating_point() else v) for k, v in ins.items()}  # rounded once
    tgt_in = {k: (v.to(device, torch_dtype) if v.is_floating_point() else v.to(device)) for k, v in ins.items()}

    target = RuntimeTargets(s, config, device, torch_dtype)
    # (operator, float32 reference, the runtime's implementation on the target)
    checks: list[tuple[str, Callable[[dict], torch.Tensor], Callable[[dict], torch.Tensor]]] = [
        ("matmul", _matmul, lambda t: F.linear(t["x"], t["w_mm"])),
        ("attention", lambda t: _attention_ref(t["q"], t["k"], t["v"]), target.attention),
        ("rms_norm", lambda t: _rms_norm_ref(t["x"], t["w_norm"], s.rms_eps), target.rms_norm),
        ("rope", lambda t: _rope_ref(t["q"], t["positions"], target.inv_freq, target.rope_scaling), target.rope_q),
        ("softmax", lambda t: t["logits"].softmax(-1), lambda t: t["logits"].softmax(-1)),
        ("silu", lambda t: F.silu(t["x"]) * t["x"].flip(-1), target.silu),
    ]
    results: list[dict[str, Any]] = []
    total = len(checks) + (2 if s.experts else 0)
    with torch.no_grad():
        for i, (name, ref_fn, tgt_fn) in enumerate(checks, 1):
            metrics = compare(ref_fn(ref_in), tgt_fn(tgt_in))
            results.append(_entry(name, metrics, th))
            if progress:
                progress(i, total)
        if s.experts:
            results.extend(_moe_checks(s, ref_in, tgt_in, th, target))
            if progress:
                progress(total, total)
    return results


def _entry(name: str, metrics: dict[str, float], th: dict[str, float]) -> dict[str, Any]:
    passed = metrics["cosine"] >= th["op_cosine"] and metrics["max_rel_err"] <= th["op_max_rel_err"]
    return {"op": name, **metrics, "passed": bool(passed)}


def _moe_checks(s: OpShapes, ref: dict[str, torch.Tensor], tgt: dict[str, torch.Tensor], th: dict[str, float],
                target: RuntimeTargets) -> list[dict[str, Any]]:
    ref_probs, ref_w, ref_idx = _route_ref(ref["x"], ref["router"], s.top_k)
    tgt_w, tgt_idx = target.route(tgt)
    tgt_w, tgt_idx = tgt_w.cpu().float(), tgt_idx.cpu()
    ref_sorted, ref_order = ref_idx.sort(-1)
    tgt_sorted, tgt_order = tgt_idx.sort(-1)
    same = (ref_sorted == tgt_sorted).all(-1)  # [T]
    top = ref_probs.sort(-1, descending=True).values  # [T, E]
    margin = top[:, s.top_k - 1] - (top[:, s.top_k] if s.top_k < top.shape[1] else 0.0)  # [T]
    near_tie = margin < th["near_tie_margin"]
    hard_agreement = same[~near_tie].float().mean().item() if (~near_tie).any() else 1.0
    # routing weights compare, expert by expert, where both sides chose the same experts
    if same.any():
        routing = compare(ref_w.gather(1, ref_order)[same], tgt_w.gather(1, tgt_order)[same])
    else:
        routing = {"cosine": 0.0, "max_rel_err": float("inf"), "max_abs_err": float("inf")}
    entry = _entry("moe_routing", routing, th)
    entry.update(topk_agreement=same.float().mean().item(), near_ties=int((near_tie & ~same).sum().item()))
    entry["passed"] = bool(entry["passed"] and hard_agreement >= th["moe_topk_agreement"])
    # expert compute with the reference routing on both sides, so it isolates the expert math
    ref_out = _experts_ref(ref["x"], ref["gate_up"], ref["down"], ref_idx, ref_w)
    tgt_out = target.experts(tgt, ref_w.to(target.device), ref_idx.to(target.device))
    return [entry, _entry("moe_experts", compare(ref_out, tgt_out), th)]


def run(ctx: StageContext) -> dict[str, Any]:
    """The operator part of the ``align`` section: ``{"ops": [...], "passed", "thresholds"}``."""
    th = {**DEFAULT_THRESHOLDS, **{k: v for k, v in ctx.thresholds.items() if k in DEFAULT_THRESHOLDS}}
    ops = run_checks(ctx.config, device=ctx.device, dtype=ctx.dtype, thresholds=th,
                     progress=lambda done, total: ctx.progress(done, total, "operators aligned"))
    ctx.check_cancelled()
    return {"ops": ops, "passed": all(op["passed"] for op in ops), "thresholds": th,
            "max_rel_err_definition": "max|ref - target| / max(max|ref|, 1e-12) over the tensor"}
