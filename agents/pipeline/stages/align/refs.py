"""Independent float64 references of the operators ``ops`` checks, written from the published math of each
family and the model's ``config.json`` alone: nothing here imports or calls the runtime's layers, and none of
them reuses the runtime's torch expression (no ``F.linear``, ``F.silu``, ``softmax``, ``scaled_dot_product_attention``
or ``F.rms_norm``; products are float64 matmuls, activations and softmax are written with ``exp``).

Weights come as checkpoint tensors (per shard: q/k/v, gate/up, per-expert w1/w3/w2), so packing them into the
runtime's fused parameters is part of what the check covers."""

from __future__ import annotations

import math
from typing import Any

import torch

Tensor = torch.Tensor
DEEPSEEK_TYPES = ("deepseek_v3", "deepseek_v2", "kimi_k2")
QK_NORM_TYPES = ("qwen3", "qwen3_moe")


def linear(x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
    """``x W^T + b`` in float64: x [T, in], w [out, in] -> [T, out]."""
    y = x.double() @ w.double().transpose(0, 1)
    return y if b is None else y + b.double()


def silu(x: Tensor) -> Tensor:
    return x / (1.0 + torch.exp(-x))


def softmax(scores: Tensor) -> Tensor:
    """Over the last axis; rows that are all ``-inf`` stay zero."""
    top = scores.amax(-1, keepdim=True).clamp_min(-1e300)
    e = torch.exp(scores - top)
    return e / e.sum(-1, keepdim=True)


def rms_norm(x: Tensor, w: Tensor, eps: float) -> Tensor:
    x = x.double()
    mean_sq = (x * x).sum(-1, keepdim=True) / x.shape[-1]
    return x / torch.sqrt(mean_sq + eps) * w.double()


def swiglu(x: Tensor, gate: Tensor, up: Tensor, down: Tensor) -> Tensor:
    """``down(silu(gate x) * up x)``: the Llama / Mixtral / DeepSeek MLP from its three checkpoint matrices."""
    return linear(silu(linear(x, gate)) * linear(x, up), down)


def rope_parameters(config: dict[str, Any]) -> dict[str, Any]:
    """``rope_parameters`` (transformers 5) or ``rope_theta`` + ``rope_scaling`` (older configs)."""
    params = dict(config.get("rope_scaling") or {})
    params.update(config.get("rope_parameters") or {})
    params.setdefault("rope_theta", config.get("rope_theta", 10000.0))
    params["rope_type"] = params.get("rope_type") or params.get("type") or "default"
    return params


def rope_interleaved(config: dict[str, Any]) -> bool:
    """DeepSeek rotates adjacent channel pairs (2i, 2i+1) of its rope part; Llama-style models rotate (i, i+d/2)."""
    return config.get("model_type") in DEEPSEEK_TYPES and bool(config.get("rope_interleave", True))


def inv_freq(config: dict[str, Any], rotary_dim: int) -> Tensor | None:
    """Inverse frequencies [rotary_dim / 2] of the default and linear rope types; None for the scaled types
    (llama3, yarn …), whose frequencies the caller takes from the runtime and says so."""
    params = rope_parameters(config)
    base = float(params["rope_theta"])
    freqs = 1.0 / base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    if params["rope_type"] == "default":
        return freqs
    if params["rope_type"] == "linear":
        return freqs / float(params["factor"])
    return None


def rope(x: Tensor, positions: Tensor, freqs: Tensor, *, interleaved: bool, scaling: float = 1.0) -> Tensor:
    """Rotate the first ``2 * len(freqs)`` channels of x [T, H, D] at ``positions`` [T] (angles in float64)."""
    x = x.double()
    rot = 2 * freqs.shape[0]
    angle = positions.double()[:, None, None] * freqs.double()[None, None, :]  # [T, 1, rot/2]
    cos, sin = torch.cos(angle) * scaling, torch.sin(angle) * scaling
    if interleaved:
        a, b = x[..., 0:rot:2], x[..., 1:rot:2]
    else:
        a, b = x[..., : rot // 2], x[..., rot // 2 : rot]
    ra, rb = a * cos - b * sin, b * cos + a * sin
    out = torch.stack((ra, rb), -1).flatten(-2) if interleaved else torch.cat((ra, rb), -1)
    return torch.cat((out, x[..., rot:]), -1)


def attention(q: Tensor, k: Tensor, v: Tensor, scale: float, *, window: int | None = None) -> Tensor:
    """Causal attention, each query head reading KV head ``h // (H / Hkv)``: q [T, H, D], k [T, Hkv, D],
    v [T, Hkv, Dv] -> [T, H * Dv]."""
    t, heads = q.shape[0], q.shape[1]
    group = heads // k.shape[1]
    i = torch.arange(t)[:, None]
    j = torch.arange(t)[None, :]
    allowed = j <= i
    if window is not None:
        allowed &= j > i - window
    outs = []
    for h in range(heads):
        kh, vh = k[:, h // group].double(), v[:, h // group].double()  # [T, D], [T, Dv]
        scores = (q[:, h].double() @ kh.transpose(0, 1)) * scale  # [T, T]
        scores = scores.masked_fill(~allowed, float("-inf"))
        outs.append(softmax(scores) @ vh)  # [T, Dv]
    return torch.stack(outs, 1).flatten(1)


def self_attention(x: Tensor, w: dict[str, Tensor], config: dict[str, Any], positions: Tensor,
                   freqs: Tensor) -> Tensor:
    """A Llama / Qwen3 attention block from its checkpoint tensors (``q``, ``k``, ``v``, ``o`` weights and
    biases, ``q_norm`` / ``k_norm``): projections, QK-norm (Qwen3), rope, causal GQA attention, output."""
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or config["hidden_size"] // heads)
    t = x.shape[0]
    q = linear(x, w["q"], w.get("q_bias")).view(t, heads, head_dim)
    k = linear(x, w["k"], w.get("k_bias")).view(t, kv_heads, head_dim)
    v = linear(x, w["v"], w.get("v_bias")).view(t, kv_heads, head_dim)
    if config.get("model_type") in QK_NORM_TYPES:
        eps = float(config.get("rms_norm_eps", 1e-6))
        q, k = rms_norm(q, w["q_norm"], eps), rms_norm(k, w["k_norm"], eps)
    q = rope(q, positions, freqs, interleaved=False)
    k = rope(k, positions, freqs, interleaved=False)
    window = config.get("sliding_window") if config.get("use_sliding_window", True) else None
    out = attention(q, k, v, head_dim**-0.5, window=window)
    return linear(out, w["o"], w.get("o_bias"))


def mla_scale(config: dict[str, Any]) -> float:
    """DeepSeek's softmax scale: ``(nope + rope) ** -0.5``, times ``mscale ** 2`` under YaRN with ``mscale_all_dim``."""
    scale = (config["qk_nope_head_dim"] + config["qk_rope_head_dim"]) ** -0.5
    params = rope_parameters(config)
    factor, mscale_all = params.get("factor"), params.get("mscale_all_dim")
    if params["rope_type"] != "default" and mscale_all and factor and factor > 1:
        m = 0.1 * float(mscale_all) * math.log(float(factor)) + 1.0
        scale *= m * m
    return scale


def mla(x: Tensor, w: dict[str, Tensor], config: dict[str, Any], positions: Tensor, freqs: Tensor,
        rope_scaling: float = 1.0) -> Tensor:
    """DeepSeek-V2/V3 multi-head latent attention written out with the keys and values up-projected (no
    absorption, no cache): ``x`` [T, hidden] -> [T, hidden]."""
    c = config
    t, heads = x.shape[0], int(c["num_attention_heads"])
    nope, rdim, vdim, rank = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"], c["kv_lora_rank"]
    eps = float(c.get("rms_norm_eps", 1e-6))
    if c.get("q_lora_rank"):
        q = linear(rms_norm(linear(x, w["q_a"], w.get("q_a_bias")), w["q_a_norm"], eps), w["q_b"])
    else:
        q = linear(x, w["q"])
    q = q.view(t, heads, nope + rdim)
    q_nope, q_pe = q[..., :nope], q[..., nope:]
    kv_a = linear(x, w["kv_a"], w.get("kv_a_bias"))  # [T, rank + rope]
    latent, k_pe = rms_norm(kv_a[:, :rank], w["kv_a_norm"], eps), kv_a[:, rank:]
    interleaved = rope_interleaved(c)
    q_pe = rope(q_pe, positions, freqs, interleaved=interleaved, scaling=rope_scaling)
    k_pe = rope(k_pe[:, None, :], positions, freqs, interleaved=interleaved, scaling=rope_scaling)  # [T, 1, R]
    kv = linear(latent, w["kv_b"]).view(t, heads, nope + vdim)
    k = torch.cat((kv[..., :nope], k_pe.expand(t, heads, rdim)), -1)  # [T, H, qk]
    out = attention(torch.cat((q_nope, q_pe), -1), k, kv[..., nope:], mla_scale(c))  # [T, H * V]
    return linear(out, w["o"], w.get("o_bias"))


def route(x: Tensor, weight: Tensor, bias: Tensor | None, config: dict[str, Any]) -> dict[str, Tensor] | None:
    """The expert choice of the family's published router, or None for a family without a reference here.

    Returns ``ids`` [T, k] and ``weights`` [T, k] (float64), and ``choice`` [T, E], the scores the top-k is
    taken over (masked groups at ``-inf``), for near-tie margins."""
    kind = config.get("model_type")
    k = int(config["num_experts_per_tok"])
    logits = linear(x, weight)  # [T, E]
    if kind in ("mixtral", "qwen3_moe", "qwen2_moe"):
        probs = softmax(logits)
        ids = probs.topk(k, -1).indices
        weights = probs.gather(1, ids)
        if kind == "mixtral" or config.get("norm_topk_prob", False):
            weights = weights / weights.sum(-1, keepdim=True)
        return {"ids": ids, "weights": weights, "choice": probs}
    if kind in DEEPSEEK_TYPES:
        scoring = config.get("scoring_func") or "sigmoid"
        scores = 1.0 / (1.0 + torch.exp(-logits)) if scoring == "sigmoid" else softmax(logits)
        uses_bias = (config.get("topk_method") or "noaux_tc") == "noaux_tc"
        choice = scores + bias.double() if uses_bias and bias is not None else scores
        n_group, topk_group = int(config.get("n_group") or 1), int(config.get("topk_group") or 1)
        if topk_group < n_group:
            t, e = choice.shape
            grouped = choice.view(t, n_group, e // n_group)
            group_score = grouped.topk(min(2, e // n_group), -1).values.sum(-1)  # [T, G]: each group's best two
            keep = torch.zeros(t, n_group, dtype=torch.bool)
            keep.scatter_(1, group_score.topk(topk_group, -1).indices, True)
            choice = choice.masked_fill(~keep.repeat_interleave(e // n_group, 1), float("-inf"))
        ids = choice.topk(k, -1).indices
        weights = scores.gather(1, ids)  # the bias steers the choice only, never the weights
        if config.get("norm_topk_prob", True):
            weights = weights / weights.sum(-1, keepdim=True)
        return {"ids": ids, "weights": weights * float(config.get("routed_scaling_factor") or 1.0), "choice": choice}
    return None


def experts(x: Tensor, w1: list[Tensor], w3: list[Tensor], w2: list[Tensor], ids: Tensor, weights: Tensor) -> Tensor:
    """Routed SwiGLU experts token by token: ``sum_j weights[t, j] * expert_{ids[t, j]}(x[t])``."""
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            out[t] += float(weights[t, j]) * swiglu(x[t : t + 1], w1[e], w3[e], w2[e])[0]
    return out
