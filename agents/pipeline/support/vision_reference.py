"""The ``transformers`` fp32 CPU reference of a vision-language model: the whole model (align's image checks) and
its language model with the LM head as a causal LM (the text checks of align, eval and the reference stage run
on the same modules)."""

from __future__ import annotations

import torch
from torch import nn

from agents.pipeline.support.context import StageContext
from agents.pipeline.support.errors import StageFailed


def reference_vlm(ctx: StageContext) -> nn.Module:
    """The whole vision-language model in ``transformers`` fp32 on CPU (kept in ``ctx.state.reference_vlm``)."""
    ref = ctx.state.reference_vlm
    if ref is not None:
        return ref
    import transformers

    arch = (ctx.config.get("architectures") or [""])[0]
    cls = getattr(transformers, arch, None) or transformers.AutoModelForImageTextToText
    try:
        ref = cls.from_pretrained(ctx.model_dir, dtype=torch.float32).eval()
    except (ValueError, OSError, KeyError) as exc:
        raise StageFailed(f"the transformers reference cannot load {ctx.model_dir}: {exc}") from exc
    ctx.state.reference_vlm = ref
    return ref


def reference_decoder(ctx: StageContext) -> nn.Module:
    """The reference's language model and LM head as a ``transformers`` causal LM (the same modules, no copy);
    where the decoder's config has no causal-LM class (Qwen2.5-VL's text model), the whole reference, which
    answers text-only prompts as one (its ``get_decoder`` names the blocks the layer report compares)."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    full = reference_vlm(ctx)
    text_config = full.config.get_text_config()
    if type(text_config) not in MODEL_FOR_CAUSAL_LM_MAPPING:
        return full
    lm = transformers.AutoModelForCausalLM.from_config(text_config, dtype=torch.float32)
    lm.model = full.model.language_model
    lm.lm_head = full.lm_head
    return lm.eval()
