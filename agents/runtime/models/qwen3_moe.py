"""Qwen3-MoE: Qwen3 attention (QK-norm) with sparse MoE layers (optional top-k renormalisation), dense MLP
on ``mlp_only_layers`` and off the ``decoder_sparse_step`` grid."""

from __future__ import annotations

from torch import nn

from agents.runtime.layers.mlp import SwiGLUMLP, check_activation
from agents.runtime.layers.moe import MoEBlock, RoutedExperts, TopKRouter
from agents.runtime.models.decoder import DENSE_MAPPING, DecoderCausalLM, require
from agents.runtime.models.registry import register


@register("Qwen3MoeForCausalLM")
class Qwen3MoeForCausalLM(DecoderCausalLM):
    qk_norm = True
    weight_mapping = [
        (".mlp.experts.{e}.gate_proj.weight", ".mlp.experts.w13", "w1"),
        (".mlp.experts.{e}.up_proj.weight", ".mlp.experts.w13", "w3"),
        (".mlp.experts.{e}.down_proj.weight", ".mlp.experts.w2", "w2"),
        *DENSE_MAPPING,
    ]

    def num_experts(self) -> int:
        return self.config.get("num_experts") or self.config.get("num_local_experts") or 0

    def is_sparse(self, layer: int) -> bool:
        c = self.config
        step = c.get("decoder_sparse_step", 1) or 1
        return layer not in (c.get("mlp_only_layers") or []) and self.num_experts() > 0 and (layer + 1) % step == 0

    def make_mlp(self, layer: int) -> nn.Module:
        c = self.config
        check_activation(c.get("hidden_act"))
        if not self.is_sparse(layer):
            return SwiGLUMLP(self.hidden, require(c, "intermediate_size"), c.get("hidden_act"))
        return MoEBlock(
            TopKRouter(self.hidden, self.num_experts(), require(c, "num_experts_per_tok"),
                       renormalize=bool(c.get("norm_topk_prob", False))),
            RoutedExperts(self.num_experts(), self.hidden, require(c, "moe_intermediate_size")),
        )
