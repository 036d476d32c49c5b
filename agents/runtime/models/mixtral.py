"""Mixtral: Llama attention with a sparse MoE block (softmax, top-k, renormalised) in every layer."""

from __future__ import annotations

from torch import nn

from agents.runtime.layers.mlp import check_activation
from agents.runtime.layers.moe import MoEBlock, RoutedExperts, TopKRouter
from agents.runtime.models.decoder import DENSE_MAPPING, DecoderCausalLM, require
from agents.runtime.models.registry import register


@register("MixtralForCausalLM")
class MixtralForCausalLM(DecoderCausalLM):
    weight_mapping = [
        (".block_sparse_moe.experts.{e}.w1.weight", ".mlp.experts.w13", "w1"),
        (".block_sparse_moe.experts.{e}.w3.weight", ".mlp.experts.w13", "w3"),
        (".block_sparse_moe.experts.{e}.w2.weight", ".mlp.experts.w2", "w2"),
        (".block_sparse_moe.gate.", ".mlp.gate.", None),
        *DENSE_MAPPING,
    ]

    def make_mlp(self, layer: int) -> nn.Module:
        c = self.config
        check_activation(c.get("hidden_act"))
        experts = require(c, "num_local_experts")
        return MoEBlock(
            TopKRouter(self.hidden, experts, require(c, "num_experts_per_tok"), renormalize=True),
            RoutedExperts(experts, self.hidden, require(c, "intermediate_size")),
        )
