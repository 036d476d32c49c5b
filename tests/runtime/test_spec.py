"""Config parsing: every family of the catalog, the 4.x and 5.x rope keys, and errors that name the key."""

from __future__ import annotations

import pytest
from transformers import LlamaConfig

from contract.hardware import load_model_catalog
from contract.model.spec import ModelSpec, SpecError, parse_config

CATALOG = {row["slug"]: row["config"] for row in load_model_catalog()}
LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 512, "hidden_size": 64,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96,
         "max_position_embeddings": 256}


@pytest.mark.parametrize("slug,family", [
    ("llama-3.1-8b", "llama"), ("qwen3-32b", "qwen3"), ("mixtral-8x7b", "mixtral"),
    ("qwen3-235b-a22b", "qwen3_moe"), ("deepseek-v3", "deepseek_v3"), ("kimi-k2", "deepseek_v3"),
    ("gpt-oss-120b", "gpt_oss"),
])
def test_catalog_configs_parse_into_their_family(slug: str, family: str) -> None:
    spec = parse_config(CATALOG[slug])
    assert spec.family == family
    assert spec.architecture == CATALOG[slug]["architectures"][0]
    assert spec.warnings == ()


def test_llama3_rope_scaling_and_gqa() -> None:
    spec = parse_config(CATALOG["llama-3.1-405b"])
    assert (spec.num_layers, spec.hidden_size, spec.num_attention_heads, spec.num_kv_heads) == (126, 16384, 128, 8)
    assert spec.head_dim == 128 and spec.rope_type == "llama3" and spec.rope_scaling["factor"] == 8.0
    assert spec.rope_theta == 500000.0 and spec.context_length == 131072 and not spec.is_moe


def test_qwen3_has_qk_norm_and_explicit_head_dim() -> None:
    spec = parse_config(CATALOG["qwen3-32b"])
    assert spec.qk_norm and spec.head_dim == 128 and spec.hidden_size // spec.num_attention_heads == 80
    assert spec.rope_type == "default" and spec.rope_scaling is None


def test_deepseek_v3_mla_and_grouped_routing() -> None:
    spec = parse_config(CATALOG["deepseek-v3"])
    assert spec.is_mla and (spec.q_lora_rank, spec.kv_lora_rank) == (1536, 512)
    assert (spec.qk_nope_head_dim, spec.qk_rope_head_dim, spec.v_head_dim, spec.qk_head_dim) == (128, 64, 128, 192)
    assert (spec.num_experts, spec.num_shared_experts, spec.num_experts_per_tok) == (256, 1, 8)
    assert spec.moe_layers == tuple(range(3, 61)) and spec.dense_layers == (0, 1, 2)
    assert (spec.n_group, spec.topk_group, spec.routed_scaling_factor) == (8, 4, 2.5)
    assert spec.scoring_func == "sigmoid" and spec.topk_method == "noaux_tc" and spec.score_correction_bias
    assert spec.rope_type == "yarn" and spec.rope_scaling["factor"] == 40 and spec.num_mtp_layers == 1


def test_kimi_k2_is_deepseek_v3_shaped() -> None:
    spec = parse_config(CATALOG["kimi-k2"])
    assert (spec.num_experts, spec.n_group, spec.topk_group, spec.num_attention_heads) == (384, 1, 1, 64)
    assert spec.moe_layers == tuple(range(1, 61)) and spec.routed_scaling_factor == 2.827


def test_q_lora_rank_may_be_null() -> None:
    config = {**CATALOG["deepseek-v3"], "q_lora_rank": None}
    assert parse_config(config).q_lora_rank is None


def test_qwen3_moe_sparse_step_and_mlp_only_layers() -> None:
    config = {**CATALOG["qwen3-30b-a3b"], "num_hidden_layers": 6, "decoder_sparse_step": 2, "mlp_only_layers": [3]}
    spec = parse_config(config)
    assert spec.moe_layers == (1, 5) and spec.norm_topk_prob and spec.moe_intermediate_size == 768


def test_deepseek_moe_layer_freq() -> None:
    config = {**CATALOG["deepseek-v3"], "num_hidden_layers": 8, "first_k_dense_replace": 1, "moe_layer_freq": 2}
    assert parse_config(config).moe_layers == (2, 4, 6)


def test_gpt_oss_sinks_sliding_window_and_biases() -> None:
    spec = parse_config(CATALOG["gpt-oss-120b"])
    assert spec.attention_sinks and spec.sliding_window == 128 and spec.router_bias and spec.expert_bias
    assert spec.layer_types.count("full_attention") == 18 and spec.num_experts == 128
    assert spec.num_experts_per_tok == 4 and spec.rope_type == "yarn"


def test_transformers_5_rope_parameters_are_read() -> None:
    config = LlamaConfig(**{k: v for k, v in LLAMA.items() if k != "model_type"}, rope_theta=123456.0).to_dict()
    config["architectures"] = ["LlamaForCausalLM"]
    assert "rope_theta" not in config and "rope_parameters" in config  # the 5.x layout
    spec = parse_config(config)
    assert spec.rope_theta == 123456.0 and spec.rope_type == "default" and spec.rope_scaling is None


@pytest.mark.parametrize("key", ["hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size",
                                 "max_position_embeddings", "intermediate_size"])
def test_missing_required_key_is_named(key: str) -> None:
    config = {k: v for k, v in LLAMA.items() if k != key}
    with pytest.raises(SpecError, match=key):
        parse_config(config)


@pytest.mark.parametrize("slug,key", [("deepseek-v3", "kv_lora_rank"), ("deepseek-v3", "moe_intermediate_size"),
                                      ("qwen3-30b-a3b", "moe_intermediate_size"),
                                      ("mixtral-8x7b", "num_experts_per_tok"), ("deepseek-v3", "v_head_dim")])
def test_missing_family_key_is_named(slug: str, key: str) -> None:
    config = {k: v for k, v in CATALOG[slug].items() if k != key}
    with pytest.raises(SpecError, match=key):
        parse_config(config)


def test_missing_architectures_is_named() -> None:
    with pytest.raises(SpecError, match="architectures"):
        parse_config({k: v for k, v in LLAMA.items() if k != "architectures"})


@pytest.mark.parametrize("change,match", [
    ({"num_key_value_heads": 3}, "num_key_value_heads"),
    ({"hidden_size": "64"}, "hidden_size"),
    ({"hidden_size": 0}, "hidden_size"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "low_freq_factor"),
    ({"rope_scaling": {"rope_type": "warp", "factor": 2.0}}, "rope_type"),
])
def test_bad_values_are_named(change: dict, match: str) -> None:
    with pytest.raises(SpecError, match=match):
        parse_config({**LLAMA, **change})


def test_moe_top_k_above_experts_is_rejected() -> None:
    with pytest.raises(SpecError, match="num_experts_per_tok"):
        parse_config({**CATALOG["mixtral-8x7b"], "num_experts_per_tok": 9})


def test_unknown_architecture_is_flagged_but_generic_keys_parse() -> None:
    spec = parse_config({**LLAMA, "architectures": ["FrobnicatorForCausalLM"], "model_type": "frob"})
    assert spec.family == "unknown" and spec.architecture == "FrobnicatorForCausalLM"
    assert spec.num_layers == 2 and spec.num_kv_heads == 2
    assert any("FrobnicatorForCausalLM" in w for w in spec.warnings)


def test_unknown_multimodal_reads_text_config() -> None:
    text = {k: v for k, v in LLAMA.items() if k != "architectures"}
    spec = parse_config({"architectures": ["FrobVisionForConditionalGeneration"], "text_config": text})
    assert spec.family == "unknown" and spec.hidden_size == 64 and len(spec.warnings) == 2


def test_model_spec_checks_its_invariants() -> None:
    good = parse_config(LLAMA)
    fields = {name: getattr(good, name) for name in good.__dataclass_fields__}
    with pytest.raises(SpecError, match="moe layer"):
        ModelSpec(**{**fields, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 8,
                     "moe_layers": (0, 5)})
    with pytest.raises(SpecError, match="family"):
        ModelSpec(**{**fields, "family": "frob"})
