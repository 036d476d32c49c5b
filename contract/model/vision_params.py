"""Exact parameter counts of a vision-language model's image side from ``config.json`` alone (no torch): the
vision tower (CLIP or SigLIP vision transformer, as ``transformers`` builds it) and the LLaVA projector, or the
Qwen2-VL / Qwen2.5-VL / Qwen3-VL vision transformer with its patch merger (the merger is its projector). The decoder's
count stays ``params.py``'s; the plan adds these (the tower is replicated, on the first stage)."""

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


QWEN_VISION_TYPES = ("qwen2_vl", "qwen2_vl_vision", "qwen2_5_vl", "qwen2_5_vl_vision")
QWEN3_VISION_TYPES = ("qwen3_vl", "qwen3_vl_vision")


def count_qwen3_vision(vision: dict[str, Any]) -> int:
    """Parameters of a Qwen3-VL vision transformer: a biased patch conv, a learned position grid, LayerNorm
    blocks with a biased GELU MLP, the patch merger, and one more merger per deepstack layer (normalised after
    the 2x2 shuffle, so over ``merge^2 x hidden``)."""
    h, inter = int(vision.get("hidden_size", 1152)), int(vision.get("intermediate_size", 4304))
    out, layers = int(vision.get("out_hidden_size", 3584)), int(vision.get("depth", 27))
    channels, frames = int(vision.get("in_channels", 3)), int(vision.get("temporal_patch_size", 2))
    patch, merge = int(vision.get("patch_size", 16)), int(vision.get("spatial_merge_size", 2))
    deepstack = len(vision.get("deepstack_visual_indexes", (8, 16, 24)))
    block = 2 * 2 * h + (3 * h * h + 3 * h) + (h * h + h) + (h * inter + inter) + (inter * h + h)
    merged = h * merge * merge
    mlp = (merged * merged + merged) + (merged * out + out)
    patch_embed = h * channels * frames * patch * patch + h
    positions = int(vision.get("num_position_embeddings", 2304)) * h
    return patch_embed + positions + layers * block + (2 * h + mlp) + deepstack * (2 * merged + mlp)


def count_qwen_vision(vision: dict[str, Any], model_type: str = "") -> int:
    """Parameters of a Qwen2-VL or Qwen2.5-VL vision transformer, patch merger included. Qwen2-VL: LayerNorms,
    a GELU MLP of ``mlp_ratio`` x ``embed_dim``, merging into ``hidden_size``; Qwen2.5-VL: RMSNorms, a biased
    SwiGLU MLP of ``intermediate_size``, merging into ``out_hidden_size``."""
    kind = str(vision.get("model_type") or model_type)  # hub configs often leave the tower's type out
    v25 = kind.startswith("qwen2_5_vl")
    h = int(vision["hidden_size"] if v25 else vision.get("embed_dim", 1280))
    out = int(vision.get("out_hidden_size", 3584) if v25 else vision.get("hidden_size", 3584))
    layers = int(vision.get("depth", 32))
    channels, frames = int(vision.get("in_channels", 3)), int(vision.get("temporal_patch_size", 2))
    patch, merge = int(vision.get("patch_size", 14)), int(vision.get("spatial_merge_size", 2))
    norm = h if v25 else 2 * h  # RMSNorm weight, or LayerNorm weight and bias
    if v25:
        inter = int(vision.get("intermediate_size", 3420))
        mlp = 2 * (h * inter + inter) + inter * h + h  # gate, up, down with biases
    else:
        inter = int(vision.get("mlp_ratio", 4)) * h
        mlp = h * inter + inter + inter * h + h  # fc1, fc2 with biases
    block = 2 * norm + (3 * h * h + 3 * h) + (h * h + h) + mlp  # norms, fused qkv, out projection, MLP
    merged = h * merge * merge
    merger = norm + (merged * merged + merged) + (merged * out + out)  # ln_q, Linear, GELU, Linear
    return h * channels * frames * patch * patch + layers * block + merger  # patch conv (no bias)


def count_vision_params(config: dict[str, Any]) -> int:
    """Vision tower + projector of a LLaVA-style ``config``, or a Qwen2-VL / Qwen2.5-VL tower and merger (0
    when it has no ``vision_config``)."""
    vision = config.get("vision_config")
    if not isinstance(vision, dict):
        return 0
    if config.get("model_type") in QWEN_VISION_TYPES or vision.get("model_type") in QWEN_VISION_TYPES:
        return count_qwen_vision(vision, str(config.get("model_type", "")))
    if config.get("model_type") in QWEN3_VISION_TYPES or vision.get("model_type") in QWEN3_VISION_TYPES:
        return count_qwen3_vision(vision)
    text = config.get("text_config") or {}
    th, vh = int(text["hidden_size"]), int(vision["hidden_size"])
    layer = config.get("vision_feature_layer", -2)
    features = vh * (len(layer) if isinstance(layer, list) else 1)
    bias = bool(config.get("multimodal_projector_bias", True))
    projector = features * th + th * th + (2 * th if bias else 0)
    return count_vision_tower(vision) + projector
