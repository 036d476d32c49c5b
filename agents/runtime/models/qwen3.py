"""Qwen3 dense decoder: Llama layout plus per-head RMSNorm on q and k (QK-norm), no attention output bias."""

from __future__ import annotations

from agents.runtime.models.llama import LlamaForCausalLM
from agents.runtime.models.registry import register


@register("Qwen3ForCausalLM")
class Qwen3ForCausalLM(LlamaForCausalLM):
    qk_norm = True
