"""Exact parameter counts of a vision-language model's image side from ``config.json`` alone (no torch): the
vision tower (CLIP or SigLIP vision transformer, as ``transformers`` builds it) and the LLaVA projector. The
decoder's count stays ``params.py``'s; the plan adds these (the tower is replicated, on the first stage)."""

from __future__ import annotations

from typing import Any


def _encoder(h: int, inter: int, layers: int) -> int:
    attention = 4 * (h * h + h)  # q, k, v, out projections with biases
    mlp = h * inter + inter + inter * h + h
    return layers * (attention + mlp + 4 * h)  # + layer_norm1, layer_norm2 (weight, bias)


def count_vision_tower(vision: dict[str, Any]) -> int:
    """Parameters of a CLIP or SigLIP vision transformer described by ``vision_config``."""
    kind = str(vision.get("model_type", "clip_vision_model"))
    h = int(vision["hidden_size"])
    inter = int(vision["intermediate_size"])
    layers = int(vision["num_hidden_layers"])
    channels = int(vision.get("num_channels", 3))
    patch = int(vision["patch_size"])
    patches = (int(vision["image_size"]) // patch) ** 2
    conv = h * channels * patch * patch
    if kind == "clip_vision_model":
        # class embedding, patch conv (no bias), positions incl. CLS, pre- and post-layernorm
        return h + conv + (patches + 1) * h + 2 * h + _encoder(h, inter, layers) + 2 * h
    if kind == "siglip_vision_model":
        total = conv + h + patches * h + _encoder(h, inter, layers) + 2 * h
        if vision.get("vision_use_head", True):  # attention-pooling head: probe, attention, norm, MLP
            total += h + (3 * h * h + 3 * h) + (h * h + h) + 2 * h + (h * inter + inter + inter * h + h)
        return total
    raise ValueError(f"vision_config.model_type {kind!r}: counted for clip_vision_model and siglip_vision_model")


def count_vision_params(config: dict[str, Any]) -> int:
    """Vision tower + projector of a LLaVA-style ``config`` (0 when it has no ``vision_config``)."""
    vision = config.get("vision_config")
    if not isinstance(vision, dict):
        return 0
    text = config.get("text_config") or {}
    th, vh = int(text["hidden_size"]), int(vision["hidden_size"])
    layer = config.get("vision_feature_layer", -2)
    features = vh * (len(layer) if isinstance(layer, list) else 1)
    bias = bool(config.get("multimodal_projector_bias", True))
    projector = features * th + th * th + (2 * th if bias else 0)
    return count_vision_tower(vision) + projector
