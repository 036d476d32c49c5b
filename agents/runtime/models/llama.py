"""Llama-style dense decoder (GQA, RoPE with default/Llama-3/YaRN scaling, RMSNorm, SwiGLU); also Mistral."""

from __future__ import annotations

from torch import nn

from agents.runtime.layers.mlp import SwiGLUMLP
from agents.runtime.models.decoder import DecoderCausalLM, require
from agents.runtime.models.registry import register


@register("LlamaForCausalLM", "MistralForCausalLM")
class LlamaForCausalLM(DecoderCausalLM):
    def make_mlp(self, layer: int) -> nn.Module:
        if self.config.get("mlp_bias"):
            raise ValueError("mlp_bias=True is not supported by the native Llama family")
        return SwiGLUMLP(self.hidden, require(self.config, "intermediate_size"), self.config.get("hidden_act"))
