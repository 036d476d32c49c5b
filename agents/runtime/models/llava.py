"""LLaVA-style vision-language models: a vision tower (CLIP or SigLIP) and a two-layer projector turn each image
into feature vectors that take the place of the image placeholder tokens' embeddings at prefill; the Llama
decoder then runs on the runtime's native paged path. The vision tower and projector are the architecture's
own ``transformers`` modules, built from the checkpoint's config, loaded strictly like every other tensor.

Under pipeline parallelism the tower and projector live on the first stage only (whole on each of its TP ranks:
the tower is small beside the decoder, and rank 0, which prepares every step, encodes the images); the features
replace stage 0's placeholder embeddings, and later stages run their layers on the hidden states they receive,
as for a text model. Their checkpoint tensors are another stage's on every later stage: never read there."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, ClassVar

import torch

from agents.runtime.layers.weights import replicated
from agents.runtime.models.llama import LlamaForCausalLM
from agents.runtime.models.mapping import WeightMapping
from agents.runtime.models.registry import register
from contract.model.native import decoder_gap

# Checkpoint prefix -> parameter prefix (the layout of LLaVA checkpoints on the hub and of transformers' save):
# the decoder's names then go through the dense mapping; the vision tower's and projector's stay as they are.
LLAVA_PREFIXES: list[tuple[str, str]] = [
    ("language_model.model.", "model."),
    ("language_model.lm_head.", "lm_head."),
]
VISION_PREFIXES: tuple[str, ...] = ("vision_tower.", "multi_modal_projector.")


class PrefixedMapping(WeightMapping):
    """A decoder's mapping under checkpoint prefixes; names under ``passthrough`` prefixes map to themselves."""

    def __init__(self, inner: WeightMapping, prefixes: list[tuple[str, str]], passthrough: tuple[str, ...]) -> None:
        self.inner = inner
        self.prefixes = prefixes
        self.passthrough = passthrough

    def to_param(self, name: str) -> str | None:
        for ckpt, param in self.prefixes:
            if name.startswith(ckpt):
                return param + name[len(ckpt):]
        return None

    def ignored(self, name: str) -> bool:
        inner = self.to_param(name)
        return inner is not None and self.inner.ignored(inner)

    def target(self, name: str) -> tuple[str, Hashable]:
        if name.startswith(self.passthrough):
            return name, None
        inner = self.to_param(name)
        if inner is None:
            raise KeyError(f"unexpected tensor {name!r}: not under {[c for c, _ in self.prefixes] + list(self.passthrough)}")
        return self.inner.target(inner)

    def checkpoint_name(self, param_name: str, shard: Hashable) -> str:
        if param_name.startswith(self.passthrough):
            return param_name
        name = self.inner.checkpoint_name(param_name, shard)
        for ckpt, param in self.prefixes:
            if name.startswith(param):
                return ckpt + name[len(param):]
        raise KeyError(f"parameter {param_name!r} has no checkpoint prefix")


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The decoder's config of a vision-language ``config`` (its ``text_config``), or ``config`` itself."""
    text = config.get("text_config")
    return text if isinstance(text, dict) else config


@register("LlavaForConditionalGeneration")
class LlavaForConditionalGeneration(LlamaForCausalLM):
    """Native Llama decoder + transformers' vision tower and ``LlavaMultiModalProjector``."""

    takes_images: ClassVar[bool] = True

    def __init__(self, config: dict[str, Any]) -> None:
        from transformers import AutoConfig, AutoModel
        from transformers.models.llava.modeling_llava import LlavaMultiModalProjector

        text = text_config(config)
        gap = decoder_gap(config)  # registry.runtime_path sends such a model to the fallback
        if gap:
            raise ValueError(f"{gap}: the native LLaVA decoder is Llama")
        super().__init__(text)
        self.vlm_config = config
        hf = AutoConfig.for_model(**{k: v for k, v in config.items() if k not in ("architectures",)})
        self.image_token_id = int(hf.image_token_id)
        self.feature_layer = hf.vision_feature_layer
        self.select_strategy = hf.vision_feature_select_strategy
        if self.select_strategy not in ("default", "full"):
            raise ValueError(f"vision_feature_select_strategy {self.select_strategy!r}: expected default or full")
        self.vision_tower = self.multi_modal_projector = None  # a later pipeline stage never sees an image
        if self.is_first:
            self.vision_tower = AutoModel.from_config(hf.vision_config).to(self.dtype)
            self.multi_modal_projector = LlavaMultiModalProjector(hf).to(self.dtype)
            for module in (self.vision_tower, self.multi_modal_projector):
                for param in module.parameters():
                    param.requires_grad_(False)
                    replicated(param)  # whole tensor on each of the stage's TP ranks (small beside the decoder)
        self.mapping = PrefixedMapping(self.mapping, LLAVA_PREFIXES, VISION_PREFIXES)
        self.num_image_encodes = 0  # images encoded so far (the engine encodes each request's images once)

    @torch.inference_mode()
    def encode_images(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Images [N, C, H, W] (the processor's output) -> features [N * tokens_per_image, hidden]: the vision
        tower's hidden states at ``vision_feature_layer`` (CLS dropped under the default strategy), projected
        into the decoder's embedding space; the rows follow the images' placeholder tokens in order. Only the first
        pipeline stage holds the tower (later stages take hidden states, not embeddings)."""
        if self.vision_tower is None:
            raise RuntimeError(f"pipeline stage {self.pp_rank} holds no vision tower: stage 0 encodes the images")
        device = self.multi_modal_projector.linear_1.weight.device
        out = self.vision_tower(pixel_values.to(device=device, dtype=self.dtype), output_hidden_states=True,
                                return_dict=True)
        layers = [self.feature_layer] if isinstance(self.feature_layer, int) else list(self.feature_layer)
        states = [out.hidden_states[i] for i in layers]  # each: [N, 1 + patches, vision_hidden]
        if self.select_strategy == "default":
            states = [s[:, 1:] for s in states]
        features = self.multi_modal_projector(torch.cat(states, dim=-1))  # [N, tokens, hidden]
        self.num_image_encodes += pixel_values.shape[0]
        return features.reshape(-1, features.shape[-1])

    def other_stage(self, name: str) -> bool:
        """The vision tower's and projector's tensors belong to the first stage; the decoder's, under their
        checkpoint prefix, to the stage that holds their layer (the decoder's rule)."""
        if name.startswith(VISION_PREFIXES):
            return not self.is_first
        inner = self.mapping.to_param(name)
        return inner is not None and super().other_stage(inner)
