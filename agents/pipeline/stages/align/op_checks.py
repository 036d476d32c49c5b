"""The operator checks of ``ops``, one per runtime module class: each runs the probed module's own forward (or
method) and the float64 reference of ``refs`` on the same checkpoint tensors, and returns report rows."""

from __future__ import annotations

from typing import Any

import torch

from agents.pipeline.stages.align import refs as ref
from agents.pipeline.stages.align.probe import (
    BLOCK_SIZE,
    TOKENS,
    Probe,
    Row,
    Unchecked,
    attention_meta,
    compare,
    draw_checkpoint_tensor,
    patched_attrs,
    report_row,
    rope_freqs,
    spread_positions,
)
from agents.pipeline.support.models import paged_context
from agents.runtime.context import ForwardContext


def check_linear(probe: Probe) -> list[Row]:
    """The dense-linear path, as a prefill (a GEMM) and as a decode step (a matrix-vector product)."""
    module = probe.module

    def packed(name: str) -> torch.Tensor | None:  # the checkpoint shards in the order the loader packs them
        param = getattr(module, name, None)
        if param is None:
            return None
        return torch.cat([probe.ckpt[(name, shard)] for shard in getattr(param, "shards", [None])])

    weight, bias = packed("weight"), packed("bias")
    x, x64 = probe.input(TOKENS, weight.shape[1])
    rows = [report_row("linear", probe, ref.linear(x64, weight, bias), probe.call(x), phase="prefill")]
    rows.append(report_row("linear", probe, ref.linear(x64[:1], weight, bias), probe.call(x[:1]), phase="decode"))
    return rows


def check_rms_norm(probe: Probe) -> list[Row]:
    dim = probe.w("weight").shape[0]
    x, x64 = probe.input(TOKENS, dim)
    eps = float(probe.config.get("rms_norm_eps", 1e-6))
    return [report_row("rms_norm", probe, ref.rms_norm(x64, probe.w("weight"), eps), probe.call(x))]


def check_embedding(probe: Probe) -> list[Row]:
    weight = probe.w("weight")
    ids = torch.randint(0, weight.shape[0], (TOKENS,), generator=torch.Generator().manual_seed(probe.seed))
    if hasattr(probe.module, "compute_logits"):
        x, x64 = probe.input(TOKENS, weight.shape[1])
        return [report_row("lm_head", probe, ref.linear(x64, weight), probe.call(x, method="compute_logits"))]
    return [report_row("embedding", probe, weight[ids], probe.call(ids.to(probe.device)))]


def check_rope(probe: Probe) -> list[Row]:
    rotary = probe.module
    c = probe.config
    head_dim = int(c.get("qk_rope_head_dim") or c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"])
    heads = max(1, min(int(c.get("num_attention_heads") or 4), 8))
    positions = spread_positions(c, TOKENS)
    q, q64 = probe.input(TOKENS, heads, head_dim)
    freqs, scaling, note = rope_freqs(c, rotary)
    with probe.target():
        out, _ = rotary(positions.to(probe.device), q, q)
    expected = ref.rope(q64, positions, freqs, interleaved=ref.rope_interleaved(c), scaling=scaling)
    row = report_row("rope", probe, expected, out, interleaved=bool(getattr(rotary, "interleaved", False)))
    if note:
        row["note"] = note
    return [row]


def check_attention(probe: Probe) -> list[Row]:
    """Causal GQA attention: no cache, and paged (prefill of all but the last token, then a decode step)."""
    attn, c = probe.module, probe.config
    scale = float(c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]) ** -0.5
    window = c.get("sliding_window") if c.get("use_sliding_window", True) else None
    q, q64 = probe.input(TOKENS, attn.num_heads, attn.head_dim)
    k, k64 = probe.input(TOKENS, attn.num_kv_heads, attn.head_dim, scale=1.01)
    v, v64 = probe.input(TOKENS, attn.num_kv_heads, attn.head_dim, scale=0.99)
    expected = ref.attention(q64, k64, v64, scale, window=window)
    meta = attention_meta(ForwardContext.for_prompts([TOKENS], device=q.device))
    with probe.target():
        plain = attn(q, k, v, meta)
    rows = [report_row("attention", probe, expected, plain, phase="prefill")]
    n_blocks = -(-TOKENS // BLOCK_SIZE)
    cache = [torch.zeros(n_blocks, BLOCK_SIZE, attn.num_kv_heads, attn.head_dim, dtype=q.dtype, device=q.device)
             for _ in range(2)]
    n = TOKENS - 1
    metas = attention_meta(paged_context(0, n, n_blocks, q.device)), attention_meta(paged_context(n, 1, n_blocks, q.device))
    with patched_attrs(attn, k_cache=None, v_cache=None, _k_slots=None, _v_slots=None), probe.target():
        attn.bind(*cache)
        first = attn(q[:n], k[:n], v[:n], metas[0])
        last = attn(q[n:], k[n:], v[n:], metas[1])
    rows.append(report_row("attention", probe, expected, torch.cat([first, last]), phase="paged prefill + decode"))
    return rows


def check_self_attention(probe: Probe) -> list[Row]:
    """The whole attention block: packed QKV, QK-norm (Qwen3), rope, attention, output projection."""
    block, c = probe.module, probe.config
    rotary = block.rotary[0]
    names = {"q": ("qkv_proj.weight", "q"), "k": ("qkv_proj.weight", "k"), "v": ("qkv_proj.weight", "v"),
             "q_bias": ("qkv_proj.bias", "q"), "k_bias": ("qkv_proj.bias", "k"), "v_bias": ("qkv_proj.bias", "v"),
             "o": ("o_proj.weight", None), "o_bias": ("o_proj.bias", None), "q_norm": ("q_norm.weight", None),
             "k_norm": ("k_norm.weight", None)}
    w = {key: probe.ckpt[k] for key, k in names.items() if k in probe.ckpt}
    x, x64 = probe.input(TOKENS, w["q"].shape[1])
    positions = spread_positions(c, TOKENS)
    freqs, scaling, note = rope_freqs(c, rotary)
    if scaling != 1.0:
        raise Unchecked(f"rope scaling {scaling} is not modelled by the reference attention block")
    expected = ref.self_attention(x64, w, c, positions, freqs)
    meta = attention_meta(ForwardContext.for_prompts([TOKENS], device=x.device), rotary, positions.to(x.device), x.dtype)
    row = report_row("self_attention", probe, expected, probe.call(x, meta), qk_norm=block.q_norm is not None)
    if note:
        row["note"] = note
    return [row]


def check_mla(probe: Probe) -> list[Row]:
    """Multi-head latent attention: no cache (keys up-projected), and paged (prefill, then the absorbed decode)."""
    block, c = probe.module, probe.config
    rotary = block.rotary[0]
    names = {"q_a": "q_a_proj.weight", "q_a_bias": "q_a_proj.bias", "q_a_norm": "q_a_layernorm.weight",
             "q_b": "q_b_proj.weight", "q": "q_proj.weight", "kv_a": "kv_a_proj_with_mqa.weight",
             "kv_a_bias": "kv_a_proj_with_mqa.bias", "kv_a_norm": "kv_a_layernorm.weight", "kv_b": "kv_b_proj.weight",
             "o": "o_proj.weight", "o_bias": "o_proj.bias"}
    w = {key: probe.ckpt[(name, None)] for key, name in names.items() if (name, None) in probe.ckpt}
    x, x64 = probe.input(TOKENS, w["kv_a"].shape[1])
    positions = spread_positions(c, TOKENS)
    freqs, scaling, note = rope_freqs(c, rotary)
    expected = ref.mla(x64, w, c, positions, freqs, scaling)
    pos = positions.to(x.device)
    meta = attention_meta(ForwardContext.for_prompts([TOKENS], device=x.device), rotary, pos, x.dtype)
    rows = [report_row("mla", probe, expected, probe.call(x, meta), phase="prefill")]
    n_blocks, n = -(-TOKENS // BLOCK_SIZE), TOKENS - 1
    cache = torch.zeros(n_blocks, BLOCK_SIZE, block.latent_dim, dtype=x.dtype, device=x.device)
    with patched_attrs(block, cache=cache):
        first = probe.call(x[:n], attention_meta(paged_context(0, n, n_blocks, x.device), rotary, pos[:n], x.dtype))
        last = probe.call(x[n:], attention_meta(paged_context(n, 1, n_blocks, x.device), rotary, pos[n:], x.dtype))
    rows.append(report_row("mla", probe, expected, torch.cat([first, last]), phase="paged prefill + absorbed decode"))
    for row in rows if note else []:
        row["note"] = note
    return rows


def check_swiglu(probe: Probe) -> list[Row]:
    gate, up = probe.ckpt[("gate_up_proj.weight", 0)], probe.ckpt[("gate_up_proj.weight", 1)]
    down = probe.ckpt[("down_proj.weight", None)]
    x, x64 = probe.input(TOKENS, gate.shape[1])
    return [report_row("swiglu_mlp", probe, ref.swiglu(x64, gate, up, down), probe.call(x))]


def check_router(probe: Probe, th: dict[str, float]) -> list[Row]:
    """The model's own router class against the family's published routing rule (from ``model_type``)."""
    c = probe.config
    weight = probe.w("weight")
    bias = probe.w("e_score_correction_bias")
    if c.get("model_type") in ref.DEEPSEEK_TYPES and (c.get("topk_method") or "noaux_tc") == "noaux_tc" and (
            bias is None):
        bias_missing = True
        bias = draw_checkpoint_tensor("e_score_correction_bias", (weight.shape[0],), torch.Generator().manual_seed(probe.seed)).double()
    else:
        bias_missing = False
    x, x64 = probe.input(TOKENS, weight.shape[1])
    expected = ref.route(x64, weight, bias, c)
    if expected is None:
        raise Unchecked(f"no reference router for model_type {c.get('model_type')!r}")
    weights, ids = probe.call(x)
    weights, ids = weights.detach().cpu().double(), ids.detach().cpu().long()
    k = expected["ids"].shape[1]
    ref_ids, ref_order = expected["ids"].sort(-1)
    tgt_ids, tgt_order = ids.sort(-1)
    same = (ref_ids == tgt_ids).all(-1)  # [T]
    top = expected["choice"].sort(-1, descending=True).values  # [T, E]
    margin = top[:, k - 1] - (top[:, k] if k < top.shape[1] else float("-inf"))
    near_tie = margin < th["near_tie_margin"]
    hard = same[~near_tie].double().mean().item() if (~near_tie).any() else 1.0
    # the router's output as a dense gate matrix [T, E] (zero for experts not chosen): a different choice is a
    # large error there, so the numbers alone judge it; tokens that disagree only on a near-tie are left out
    keep = same | ~near_tie
    experts = expected["choice"].shape[1]
    dense_ref = torch.zeros(TOKENS, experts, dtype=torch.float64).scatter_(1, expected["ids"], expected["weights"])
    dense_tgt = torch.zeros(TOKENS, experts, dtype=torch.float64).scatter_(1, ids, weights)
    metrics = compare(dense_ref[keep], dense_tgt[keep])
    row = {"op": "router", "module": type(probe.module).__name__, "where": probe.path, **metrics,
           "topk_agreement": same.double().mean().item(), "hard_topk_agreement": hard,
           "near_ties": int((near_tie & ~same).sum().item()), "rule": _router_rule(c)}
    row["_extra_ok"] = hard >= th["moe_topk_agreement"] and not bias_missing
    if bias_missing:
        row["problem"] = "the router has no e_score_correction_bias parameter, which this family's routing uses"
    elif hard < th["moe_topk_agreement"]:
        row["problem"] = (f"expert choice differs from the reference on {int((~same & ~near_tie).sum())} of "
                          f"{TOKENS} tokens (not near-ties)")
    return [row]


def _router_rule(c: dict[str, Any]) -> str:
    if c.get("model_type") in ref.DEEPSEEK_TYPES:
        return (f"{c.get('scoring_func') or 'sigmoid'} scores + correction bias, {c.get('topk_group') or 1} of "
                f"{c.get('n_group') or 1} groups, top-{c['num_experts_per_tok']}, x{c.get('routed_scaling_factor') or 1}")
    return f"softmax top-{c['num_experts_per_tok']}" + (" renormalised" if c.get("model_type") == "mixtral" or
                                                          c.get("norm_topk_prob") else "")


def check_experts(probe: Probe) -> list[Row]:
    """Routed experts with the same (random) routing on both sides, so the check isolates the expert math:
    a prefill batch, and one token (the decode path)."""
    module = probe.module
    n = module.num_experts
    w1 = [probe.ckpt[("w13", (e, "w1"))] for e in range(n)]
    w3 = [probe.ckpt[("w13", (e, "w3"))] for e in range(n)]
    w2 = [probe.ckpt[("w2", (e, "w2"))] for e in range(n)]
    k = max(1, min(int(probe.config.get("num_experts_per_tok") or 2), n))
    g = torch.Generator().manual_seed(probe.seed + 1)
    ids = torch.stack([torch.randperm(n, generator=g)[:k] for _ in range(TOKENS)])  # [T, k]
    weights = torch.rand(TOKENS, k, generator=g).float()  # fp32 as the routers return them
    x, x64 = probe.input(TOKENS, w1[0].shape[1])
    expected = ref.experts(x64, w1, w3, w2, ids, weights.double())
    out = probe.call(x, weights.to(x.device), ids.to(x.device))
    rows = [report_row("moe_experts", probe, expected, out, phase="prefill")]
    one = probe.call(x[:1], weights[:1].to(x.device), ids[:1].to(x.device))
    rows.append(report_row("moe_experts", probe, expected[:1], one, phase="decode"))
    return rows
