"""Parameter counts from the spec alone equal transformers' on the meta device, and the published totals."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from contract.hardware import DATA_DIR, load_model_catalog
from contract.model.params import count_params
from contract.model.spec import parse_config

BASE = {"vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 96, "max_position_embeddings": 256}
TINY: dict[str, dict] = {
    "llama": {**BASE, "architectures": ["LlamaForCausalLM"], "model_type": "llama"},
    "llama-tied-biases": {**BASE, "architectures": ["LlamaForCausalLM"], "model_type": "llama",
                          "tie_word_embeddings": True, "attention_bias": True, "mlp_bias": True, "head_dim": 24},
    "qwen3": {**BASE, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "head_dim": 32},
    "mixtral": {**BASE, "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "num_local_experts": 4,
                "num_experts_per_tok": 2},
    "qwen3-moe": {**BASE, "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "num_experts": 6,
                  "num_experts_per_tok": 2, "moe_intermediate_size": 48, "head_dim": 16, "num_hidden_layers": 4,
                  "decoder_sparse_step": 2, "mlp_only_layers": [3], "norm_topk_prob": True},
    "deepseek-v3": {**BASE, "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
                    "num_key_value_heads": 4, "n_routed_experts": 8, "n_shared_experts": 2,
                    "num_experts_per_tok": 2, "moe_intermediate_size": 32, "first_k_dense_replace": 1, "n_group": 2,
                    "topk_group": 1, "q_lora_rank": 48, "kv_lora_rank": 32, "qk_nope_head_dim": 16,
                    "qk_rope_head_dim": 8, "v_head_dim": 16, "num_nextn_predict_layers": 1},
    "deepseek-v3-no-q-lora-bias": {**BASE, "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
                                   "num_key_value_heads": 4, "n_routed_experts": 4, "n_shared_experts": 1,
                                   "num_experts_per_tok": 2, "moe_intermediate_size": 32, "first_k_dense_replace": 0,
                                   "n_group": 1, "topk_group": 1, "q_lora_rank": None, "kv_lora_rank": 32,
                                   "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 24,
                                   "attention_bias": True},
    "gpt-oss": {**BASE, "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "num_local_experts": 4,
                "num_experts_per_tok": 2, "head_dim": 16, "attention_bias": True, "sliding_window": 8,
                "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]},
}


def transformers_count(config: dict) -> int:
    """Parameters of the transformers model built on the meta device, plus DeepSeek's score-correction bias
    (a checkpoint tensor transformers keeps as a buffer)."""
    cfg = {k: v for k, v in config.items() if k not in ("quantization_config", "auto_map", "_comment")}
    model_type = "deepseek_v3" if cfg["architectures"][0] == "DeepseekV3ForCausalLM" else cfg["model_type"]
    cfg.pop("model_type", None)
    hf_config = AutoConfig.for_model(model_type, **cfg)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config)
    params = sum(p.numel() for p in model.parameters())  # tied weights are one parameter
    buffers = sum(b.numel() for name, b in model.named_buffers() if name.endswith("e_score_correction_bias"))
    return params + buffers


@pytest.mark.parametrize("name", sorted(TINY))
def test_tiny_config_counts_equal_transformers_on_meta(name: str) -> None:
    assert count_params(parse_config(TINY[name])).total == transformers_count(TINY[name])


CATALOG = {row["slug"]: row for row in load_model_catalog()}


@pytest.mark.parametrize("slug", sorted(CATALOG) + ["synthetic-3t-moe"])
def test_real_config_counts_equal_transformers_on_meta(slug: str) -> None:
    config = json.loads((DATA_DIR / "configs" / f"{slug}.json").read_text())
    assert count_params(parse_config(config)).total == transformers_count(config)


@pytest.mark.parametrize("slug", sorted(CATALOG))
def test_totals_within_two_percent_of_published(slug: str) -> None:
    row = CATALOG[slug]
    counts = count_params(parse_config(row["config"]))
    assert counts.total == pytest.approx(row["published_params_total"], rel=0.02)


@pytest.mark.parametrize("slug", sorted(CATALOG))
def test_active_close_to_published(slug: str) -> None:
    row = CATALOG[slug]
    counts = count_params(parse_config(row["config"]))
    active = counts.active - (counts.embedding if row.get("active_excludes_embedding") else 0)
    # publishers round active counts to one or two digits ("32B", "22B"), hence 3 %
    assert active == pytest.approx(row["published_params_active"], rel=0.03)


def test_dense_active_equals_total_and_moe_active_by_hand() -> None:
    dense = count_params(parse_config(TINY["llama"]))
    assert dense.active == dense.total
    spec = parse_config(TINY["mixtral"])
    counts = count_params(spec)
    expert = 3 * 64 * 96
    assert counts.total - counts.active == 3 * (4 - 2) * expert  # 3 layers, 2 unused experts each


def test_mtp_layers_are_not_counted() -> None:
    config = dict(TINY["deepseek-v3"])
    with_mtp = count_params(parse_config(config)).total
    config["num_nextn_predict_layers"] = 0
    assert count_params(parse_config(config)).total == with_mtp


def test_deepseek_v3_breakdown_matches_its_shape() -> None:
    counts = count_params(parse_config(CATALOG["deepseek-v3"]["config"]))
    assert counts.total == 671_026_419_200
    assert sum(1 for layer in counts.layers if layer.experts) == 58  # first_k_dense_replace = 3
    assert counts.layers[3].experts == 256 * 3 * 7168 * 2048
