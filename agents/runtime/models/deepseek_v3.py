"""DeepSeek-V3 (and Kimi-K2, which ships the same architecture name): multi-head latent attention with a
compressed-latent paged cache, grouped top-k sigmoid routing with a score-correction bias, shared experts, and
``first_k_dense_replace`` dense layers before the MoE ones.

Both ship FP8 (``quantization_config.quant_method == "fp8"``, 128×128 ``weight_block_size``): the MLA
projections, dense MLPs, routed and shared experts as ``float8_e4m3fn`` with ``<name>_scale_inv``; embeddings,
norms, the LM head and the router in bf16, ``e_score_correction_bias`` in fp32. ``checkpoint_tensors`` (the shared
declaration in ``layers/quant.py``) accepts exactly that; weights are dequantised into the runtime dtype on load."""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import nn

from agents.runtime.interface import KVCacheSpec
from agents.runtime.layers.grouped_router import GroupedTopKRouter
from agents.runtime.layers.mla import MLAttention
from agents.runtime.layers.mlp import SwiGLUMLP, check_activation
from agents.runtime.layers.moe import MoEBlock, RoutedExperts
from agents.runtime.layers.rotary import RotaryEmbedding
from agents.runtime.models.decoder import DecoderCausalLM, require
from agents.runtime.models.registry import register

_MLA_KEYS = ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


@register("DeepseekV3ForCausalLM")
class DeepseekV3ForCausalLM(DecoderCausalLM):
    # q_a_proj, kv_a_proj_with_mqa, kv_b_proj, o_proj, the norms and the router keep their checkpoint names.
    weight_mapping = [
        (".mlp.experts.{e}.gate_proj.weight", ".mlp.experts.w13", "w1"),
        (".mlp.experts.{e}.up_proj.weight", ".mlp.experts.w13", "w3"),
        (".mlp.experts.{e}.down_proj.weight", ".mlp.experts.w2", "w2"),
        (".gate_proj.", ".gate_up_proj.", 0),  # dense layers and shared experts
        (".up_proj.", ".gate_up_proj.", 1),
    ]

    def __init__(self, config: dict[str, Any]) -> None:
        for key in _MLA_KEYS:
            require(config, key)
        # the only rotary dims are the decoupled rope part; real configs carry no head_dim (or a misleading one)
        super().__init__({**config, "head_dim": config["qk_rope_head_dim"]})
        self.config = config
        mtp = int(config.get("num_nextn_predict_layers") or 0)
        # multi-token-prediction layers ship after the last decoder layer; this runtime does not run them
        self.mapping.ignored_patterns += [re.compile(rf"^model\.layers\.{self.num_layers + i}\.") for i in range(mtp)]

    # ---- family hooks ------------------------------------------------------------------------------------
    def make_attention(self, layer: int) -> nn.Module:
        if not getattr(self, "_mla_rotary", False):
            self._mla_rotary = True  # DeepSeek rotates interleaved pairs of the rope part (built once per stage)
            interleave = bool(self.config.get("rope_interleave", True))
            self.rotary = RotaryEmbedding(self.config["qk_rope_head_dim"], self.config, interleaved=interleave)
        return MLAttention(self.config, self.rotary)

    def is_moe(self, layer: int) -> bool:
        c = self.config
        freq = c.get("moe_layer_freq", 1) or 1
        return bool(c.get("n_routed_experts")) and layer >= c.get("first_k_dense_replace", 0) and layer % freq == 0

    def make_mlp(self, layer: int) -> nn.Module:
        c = self.config
        check_activation(c.get("hidden_act"))
        if not self.is_moe(layer):
            return SwiGLUMLP(self.hidden, require(c, "intermediate_size"), c.get("hidden_act"))
        experts, inter = require(c, "n_routed_experts"), require(c, "moe_intermediate_size")
        gate = GroupedTopKRouter(
            self.hidden, experts, require(c, "num_experts_per_tok"),
            n_group=c.get("n_group") or 1, topk_group=c.get("topk_group") or 1,
            scoring=c.get("scoring_func") or "sigmoid", renormalize=bool(c.get("norm_topk_prob", True)),
            scaling_factor=float(c.get("routed_scaling_factor") or 1.0),
            use_correction_bias=(c.get("topk_method") or "noaux_tc") == "noaux_tc",
        )
        shared = None
        if c.get("n_shared_experts"):
            shared = SwiGLUMLP(self.hidden, inter * c["n_shared_experts"], c.get("hidden_act"), reduce_results=False)
        return MoEBlock(gate, RoutedExperts(experts, self.hidden, inter), shared)

    # ---- the latent cache --------------------------------------------------------------------------------
    def attention_layers(self) -> list[nn.Module]:
        return [layer.self_attn for layer in self.stage_layers]

    def kv_cache_spec(self) -> KVCacheSpec | None:
        latent = self.attention_layers()[0].latent_dim
        return KVCacheSpec("mla", len(self.stage_layers), latent_dim=latent, dtype=self.dtype)

    def bind_kv_cache(self, caches: list[tuple[torch.Tensor, ...]]) -> None:
        layers = self.attention_layers()
        if len(caches) != len(layers):
            raise ValueError(f"got {len(caches)} cache tuples for {len(layers)} layers")
        for i, (attn, entry) in enumerate(zip(layers, caches, strict=True)):
            if len(entry) != 1 or entry[0].dim() != 3 or entry[0].shape[-1] != attn.latent_dim:
                raise ValueError(f"layer {i}: expected (latent_cache,) of [blocks, block_size, {attn.latent_dim}], "
                                 f"got {[tuple(t.shape) for t in entry]}")
            attn.cache = entry[0]
