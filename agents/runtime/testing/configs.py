"""Configs of the test models: ``tiny`` (fast unit tests: 2–3 layers, hidden 64, vocab 512) and ``100m``
(about 100M parameters, Llama-like dimensions, for benchmarks). Written as plain dicts in Hugging Face
``config.json`` form; ``make_model`` fills in the special-token ids and the trained vocabulary size."""

from __future__ import annotations

import copy
from typing import Any

ARCHES: tuple[str, ...] = ("llama", "qwen3", "mixtral", "qwen3-moe", "deepseek-v3", "llava", "llava-siglip",
                           "qwen2-vl", "qwen2.5-vl", "qwen3-vl")
SIZES: tuple[str, ...] = ("tiny", "100m")

_ROPE = {"rope_type": "default", "rope_theta": 10000.0}

_TINY_DENSE = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-6,
    "rope_parameters": _ROPE,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
}

# ~100M: hidden 768, 12 heads of 64, GQA 4 KV heads, vocab 32000.
_100M_DENSE = {
    "hidden_size": 768,
    "intermediate_size": 2048,
    "num_hidden_layers": 8,
    "num_attention_heads": 12,
    "num_key_value_heads": 4,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "rope_parameters": _ROPE,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
}

_CONFIGS: dict[tuple[str, str], dict[str, Any]] = {
    ("llama", "tiny"): {"model_type": "llama", "architectures": ["LlamaForCausalLM"], **_TINY_DENSE},
    # Qwen3: head_dim decoupled from hidden/heads, QK-norm, tied embeddings (as the small Qwen3 models ship).
    ("qwen3", "tiny"): {
        "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], **_TINY_DENSE,
        "head_dim": 32, "tie_word_embeddings": True,
    },
    ("mixtral", "tiny"): {
        "model_type": "mixtral", "architectures": ["MixtralForCausalLM"], **_TINY_DENSE,
        "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": None,
    },
    ("qwen3-moe", "tiny"): {
        "model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], **_TINY_DENSE,
        "head_dim": 16, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
        "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
    },
    # DeepSeek-V3: MLA (q/kv LoRA ranks, rope/nope split), 1 first dense layer, 8 routed experts in 4 groups,
    # top-2 from the best 2 groups, one shared expert, routed scaling, score-correction bias.
    ("deepseek-v3", "tiny"): {
        "model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"], **_TINY_DENSE,
        "num_hidden_layers": 3, "num_key_value_heads": 4,
        "q_lora_rank": 32, "kv_lora_rank": 16, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
        "head_dim": 8, "first_k_dense_replace": 1, "n_routed_experts": 8, "num_experts_per_tok": 2,
        "n_group": 4, "topk_group": 2, "n_shared_experts": 1, "moe_intermediate_size": 32,
        "routed_scaling_factor": 2.5, "norm_topk_prob": True, "num_nextn_predict_layers": 0,
        "rope_interleave": True,
    },
    # LLaVA: a CLIP vision tower (32x32 images in 8x8 patches: 16 image tokens once the CLS is dropped), a
    # two-layer GELU projector and the tiny Llama decoder; features from the vision tower's second-to-last layer.
    ("llava", "tiny"): {
        "model_type": "llava", "architectures": ["LlavaForConditionalGeneration"],
        "text_config": {"model_type": "llama", **_TINY_DENSE},
        "vision_config": {
            "model_type": "clip_vision_model", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 2, "image_size": 32, "patch_size": 8, "num_channels": 3, "projection_dim": 32,
            "hidden_act": "quick_gelu", "layer_norm_eps": 1e-5,
        },
        "vision_feature_layer": -2, "vision_feature_select_strategy": "default", "projector_hidden_act": "gelu",
        "multimodal_projector_bias": True, "image_seq_length": 16, "tie_word_embeddings": False, "torch_dtype": "float32",
    },
    # LLaVA on a SigLIP tower: no CLS token, so every patch is an image token (the "full" strategy), and no
    # attention-pooling head (LLaVA reads hidden states, not the pooled output).
    ("llava-siglip", "tiny"): {
        "model_type": "llava", "architectures": ["LlavaForConditionalGeneration"],
        "text_config": {"model_type": "llama", **_TINY_DENSE},
        "vision_config": {
            "model_type": "siglip_vision_model", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 2, "image_size": 32, "patch_size": 8, "num_channels": 3,
            "hidden_act": "gelu_pytorch_tanh", "layer_norm_eps": 1e-6, "vision_use_head": False,
        },
        "vision_feature_layer": -2, "vision_feature_select_strategy": "full", "projector_hidden_act": "gelu",
        "multimodal_projector_bias": True, "image_seq_length": 16, "tie_word_embeddings": False, "torch_dtype": "float32",
    },
    # Qwen2.5-VL (the transformers fallback): dynamic resolution, 8x8 patches over 2 frames (a still image is
    # repeated), 2x2 patches merged into one image token, windowed attention in block 0 (windows of 32 pixels)
    # and full attention in block 1; M-RoPE over (time, height, width) sections of the decoder's head dim.
    ("qwen2.5-vl", "tiny"): {
        "model_type": "qwen2_5_vl", "architectures": ["Qwen2_5_VLForConditionalGeneration"],
        "text_config": {
            "model_type": "qwen2_5_vl_text", **_TINY_DENSE,
            "rope_parameters": {**_ROPE, "mrope_section": [2, 3, 3]},
        },
        "vision_config": {
            "model_type": "qwen2_5_vl_vision", "depth": 2, "hidden_size": 32, "intermediate_size": 64,
            "num_heads": 2, "in_channels": 3, "patch_size": 8, "spatial_merge_size": 2, "temporal_patch_size": 2,
            "window_size": 32, "out_hidden_size": 64, "fullatt_block_indexes": [1], "tokens_per_second": 4,
            "hidden_act": "silu",
        },
        "tie_word_embeddings": False, "torch_dtype": "float32",
    },
    # Qwen2-VL: the same image-token scheme and M-RoPE; its tower has LayerNorms, a GELU MLP and full attention
    # in every block (no windows), and merges into the decoder's hidden size.
    ("qwen2-vl", "tiny"): {
        "model_type": "qwen2_vl", "architectures": ["Qwen2VLForConditionalGeneration"],
        "text_config": {
            "model_type": "qwen2_vl_text", **_TINY_DENSE,
            "rope_parameters": {**_ROPE, "mrope_section": [2, 3, 3]},
        },
        "vision_config": {
            "model_type": "qwen2_vl_vision", "depth": 2, "embed_dim": 32, "hidden_size": 64, "mlp_ratio": 2,
            "num_heads": 2, "in_channels": 3, "patch_size": 8, "spatial_merge_size": 2, "temporal_patch_size": 2,
            "hidden_act": "quick_gelu",
        },
        "tie_word_embeddings": False, "torch_dtype": "float32",
    },
    # Qwen3-VL: the same image tokens; a learned position grid (4 x 4, interpolated to each image's grid) in the
    # tower, interleaved M-RoPE and QK-norm in the decoder, and "deepstack": the outputs of vision blocks 0 and 1,
    # merged, are added to the image tokens' hidden states after decoder layers 0 and 1.
    ("qwen3-vl", "tiny"): {
        "model_type": "qwen3_vl", "architectures": ["Qwen3VLForConditionalGeneration"],
        "text_config": {
            "model_type": "qwen3_vl_text", **_TINY_DENSE, "head_dim": 16,
            "rope_parameters": {**_ROPE, "mrope_section": [2, 3, 3], "mrope_interleaved": True},
        },
        "vision_config": {
            "model_type": "qwen3_vl_vision", "depth": 3, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
            "in_channels": 3, "patch_size": 8, "spatial_merge_size": 2, "temporal_patch_size": 2,
            "out_hidden_size": 64, "num_position_embeddings": 16, "deepstack_visual_indexes": [0, 1],
            "hidden_act": "gelu_pytorch_tanh",
        },
        "tie_word_embeddings": False, "torch_dtype": "float32",
    },
    ("llama", "100m"): {"model_type": "llama", "architectures": ["LlamaForCausalLM"], **_100M_DENSE},
    ("qwen3", "100m"): {
        "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], **_100M_DENSE,
        "head_dim": 64, "num_hidden_layers": 12, "tie_word_embeddings": True,
    },
    ("mixtral", "100m"): {
        "model_type": "mixtral", "architectures": ["MixtralForCausalLM"], **_100M_DENSE,
        "intermediate_size": 1024, "num_hidden_layers": 5, "num_local_experts": 4, "num_experts_per_tok": 2,
        "sliding_window": None,
    },
    ("qwen3-moe", "100m"): {
        "model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], **_100M_DENSE,
        "head_dim": 64, "num_hidden_layers": 5, "num_experts": 8, "num_experts_per_tok": 2,
        "moe_intermediate_size": 512, "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
    },
    ("deepseek-v3", "100m"): {
        "model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"], **_100M_DENSE,
        "num_hidden_layers": 5, "num_key_value_heads": 12, "intermediate_size": 2048,
        "q_lora_rank": 256, "kv_lora_rank": 128, "qk_nope_head_dim": 64, "qk_rope_head_dim": 32, "v_head_dim": 64,
        "head_dim": 32, "first_k_dense_replace": 1, "n_routed_experts": 8, "num_experts_per_tok": 2,
        "n_group": 4, "topk_group": 2, "n_shared_experts": 1, "moe_intermediate_size": 512,
        "routed_scaling_factor": 2.5, "norm_topk_prob": True, "num_nextn_predict_layers": 0,
        "rope_interleave": True,
    },
}


def model_config(arch: str, size: str) -> dict[str, Any]:
    """A fresh copy of the config dict for ``arch`` at ``size``."""
    try:
        return copy.deepcopy(_CONFIGS[(arch, size)])
    except KeyError:
        raise ValueError(f"no config for arch {arch!r} at size {size!r}") from None
