"""Exact parameter counts from a ModelSpec alone — no weights, no torch.

What is counted (every tensor the Hugging Face checkpoint stores for the decoder, matching ``transformers``):
token embedding; the LM head unless ``tie_word_embeddings``; the final norm; per layer the two RMSNorm weights,
attention projections with their biases when ``attention_bias`` (Qwen3 adds the per-head q/k norms; MLA adds
the q/kv down-projections, their RMSNorms, the up-projections and the output projection; gpt-oss adds one
attention-sink logit per head), the dense SwiGLU MLP or the MoE block: router weight (+ bias for gpt-oss, + the
score-correction bias for DeepSeek-V3, a checkpoint tensor that ``transformers`` keeps as a buffer), every routed
expert (+ biases for gpt-oss) and the shared experts. Not counted: multi-token-prediction layers
(``num_nextn_predict_layers``), as in the published totals, and non-persistent buffers (rotary frequencies).

Active parameters: the total minus, in every MoE layer, the routed experts a token does not use
(``num_experts - num_experts_per_tok`` of them); embeddings and head are counted as active.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from contract.model.spec import ModelSpec


@dataclass(frozen=True)
class LayerParams:
    """One decoder layer's parameters by how a plan shards them.

    ``attn_sharded`` and ``mlp``/``shared_experts`` split across tensor-parallel ranks; ``attn_replicated``
    (MLA down-projections) is copied to every rank; ``experts`` split across the expert-parallel group;
    ``small`` (norms, biases, sinks, router) is replicated and never quantised."""

    attn_sharded: int
    attn_replicated: int
    mlp: int
    shared_experts: int
    experts: int
    expert_size: int
    top_k: int
    small: int

    @property
    def total(self) -> int:
        return self.attn_sharded + self.attn_replicated + self.mlp + self.shared_experts + self.experts + self.small

    @property
    def active(self) -> int:
        return self.total - self.experts + self.top_k * self.expert_size

    @property
    def quantizable(self) -> int:
        """Linear weights (the part fp8/int8/int4 checkpoints quantise)."""
        return self.attn_sharded + self.attn_replicated + self.mlp + self.shared_experts + self.experts


@dataclass(frozen=True)
class ParamCount:
    """Total and active parameters, with the breakdown the planner shards."""

    total: int
    active: int
    embedding: int = 0
    lm_head: int = 0
    final_norm: int = 0
    layers: tuple[LayerParams, ...] = ()
    vision: int = 0  # vision tower + projector of a vision-language model (replicated, never quantised)

    def kind_counts(self) -> list[tuple[LayerParams, int]]:
        """Each distinct layer with how many times it occurs: sums over layers cost O(kinds), not O(layers)
        (``count_params`` shares one object per kind, so grouping by identity is exact and C-speed)."""
        counts = Counter(map(id, self.layers))
        by_id: dict[int, LayerParams] = {}
        for layer in self.layers:  # stops once every kind is seen (the first few layers, as a rule)
            by_id.setdefault(id(layer), layer)
            if len(by_id) == len(counts):
                break
        return [(by_id[key], n) for key, n in counts.items()]

    def to_dict(self) -> dict[str, int]:
        kinds = self.kind_counts()
        return {"total": self.total, "active": self.active, "embedding": self.embedding, "lm_head": self.lm_head,
                "layers": sum(layer.total * n for layer, n in kinds),
                "routed_experts": sum(layer.experts * n for layer, n in kinds), "vision": self.vision}


def _attention(spec: ModelSpec) -> tuple[int, int, int]:
    """(sharded linear weights, replicated linear weights, small tensors) of one attention block."""
    h, nh = spec.hidden_size, spec.num_attention_heads
    if spec.is_mla:
        qk = spec.qk_head_dim
        small = spec.kv_lora_rank  # kv_a_layernorm
        kv_a = h * (spec.kv_lora_rank + spec.qk_rope_head_dim)
        kv_b = spec.kv_lora_rank * nh * (spec.qk_nope_head_dim + spec.v_head_dim)
        o = nh * spec.v_head_dim * h
        if spec.q_lora_rank is None:
            q_sharded, q_repl = h * nh * qk, 0
        else:
            q_sharded, q_repl = spec.q_lora_rank * nh * qk, h * spec.q_lora_rank
            small += spec.q_lora_rank  # q_a_layernorm
        if spec.attention_bias:  # transformers puts biases on the down-projections and o_proj only
            small += (spec.q_lora_rank or 0) + spec.kv_lora_rank + spec.qk_rope_head_dim + h
        return q_sharded + kv_b + o, q_repl + kv_a, small
    hd, kv = spec.head_dim, spec.num_kv_heads
    weights = h * nh * hd + 2 * h * kv * hd + nh * hd * h
    small = (nh * hd + 2 * kv * hd + h) if spec.attention_bias else (nh * hd + 2 * kv * hd) if spec.qkv_bias else 0
    if spec.qk_norm:
        small += 2 * hd
    if spec.attention_sinks:
        small += nh
    return weights, 0, small


def count_layer(spec: ModelSpec, moe: bool) -> LayerParams:
    """Parameters of one decoder layer (``moe``: whether its MLP is the routed MoE block)."""
    h = spec.hidden_size
    attn_sharded, attn_repl, small = _attention(spec)
    small += 2 * h  # input and post-attention norms
    mlp = shared = experts = expert_size = top_k = 0
    if moe:
        e, mi = spec.num_experts, spec.moe_intermediate_size
        expert_size = 3 * h * mi + ((2 * mi + h) if spec.expert_bias else 0)
        experts, top_k = e * expert_size, spec.num_experts_per_tok
        small += e * h + (e if spec.router_bias else 0) + (e if spec.score_correction_bias else 0)
        shared = 3 * h * mi * spec.num_shared_experts
    else:
        mlp = 3 * h * spec.intermediate_size
        if spec.mlp_bias:
            small += 2 * spec.intermediate_size + h
    return LayerParams(attn_sharded, attn_repl, mlp, shared, experts, expert_size, top_k, small)


def count_params(spec: ModelSpec) -> ParamCount:
    """Exact total and active parameter counts of ``spec`` (see the module docstring for what is counted)."""
    moe = set(spec.moe_layers)
    # layers of one kind are identical: count each kind once
    kinds = {kind: count_layer(spec, kind) for kind in {i in moe for i in range(spec.num_layers)}}
    layers = tuple(kinds[i in moe] for i in range(spec.num_layers))
    embedding = spec.vocab_size * spec.hidden_size
    lm_head = 0 if spec.tie_word_embeddings else embedding
    final_norm = spec.hidden_size
    fixed = embedding + lm_head + final_norm + spec.vision_params
    total = fixed + sum(layer.total for layer in layers)
    active = fixed + sum(layer.active for layer in layers)
    return ParamCount(total, active, embedding, lm_head, final_norm, layers, spec.vision_params)
