"""Config variants of the native families against transformers (fp32): RoPE scalings (Llama-3, YaRN, linear),
Mistral's sliding window, attention biases, tied embeddings, partial rotary tables, bf16/fp16 runs."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from agents.runtime.context import ForwardContext
from agents.runtime.layers.rotary import inv_frequencies, rope_parameters
from agents.runtime.loader import load_model
from agents.runtime.models.simple_decode import greedy_decode
from tests.runtime.variants import save_variant

BASE = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6)

LLAMA3 = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64,
        "beta_fast": 32.0, "beta_slow": 1.0}
LINEAR = {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}


def _save(tmp: Path, config) -> Path:
    return save_variant(tmp, config, max_shard_size="40KB")


def _compare(path: Path, lengths=(9, 4, 14)) -> None:
    from transformers import AutoModelForCausalLM

    ours = load_model(path).model
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, ours.config["vocab_size"], (n,), generator=gen) for n in lengths]
    out = ours.forward(torch.cat(prompts), torch.cat([torch.arange(n) for n in lengths]),
                       ForwardContext.for_prompts(list(lengths)))
    logits = ours.compute_logits(out.hidden)
    start = 0
    for p in prompts:
        with torch.no_grad():
            expected = ref(p[None]).logits[0]
        torch.testing.assert_close(logits[start : start + len(p)], expected, atol=1e-4, rtol=0)
        start += len(p)
    # incremental decode through the paged cache reproduces the first greedy token of a longer run
    tokens = greedy_decode(ours, [prompts[2].tolist()], 6, block_size=4, prefill_chunk=3)[0]
    seq = prompts[2][None]
    with torch.no_grad():
        for _ in range(6):
            seq = torch.cat([seq, ref(seq).logits[0, -1].argmax().view(1, 1)], 1)
    assert tokens == seq[0, len(prompts[2]) :].tolist()


@pytest.mark.parametrize("rope", [LLAMA3, YARN, LINEAR], ids=["llama3", "yarn", "linear"])
def test_llama_rope_scalings_match_transformers(tmp_path, rope):
    from transformers import LlamaConfig

    _compare(_save(tmp_path, LlamaConfig(**BASE, rope_parameters=rope, attention_bias=True)))


def test_mistral_sliding_window_matches_transformers(tmp_path):
    from transformers import MistralConfig

    _compare(_save(tmp_path, MistralConfig(**BASE, sliding_window=5)))


def test_qwen3_with_attention_bias_and_tied_embeddings_matches_transformers(tmp_path):
    from transformers import Qwen3Config

    _compare(_save(tmp_path, Qwen3Config(**BASE, head_dim=16, attention_bias=True, tie_word_embeddings=True)))


@pytest.mark.parametrize("rope", [LLAMA3, YARN, {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
                                                 "original_max_position_embeddings": 64, "mscale": 1.0,
                                                 "mscale_all_dim": 0.8, "partial_rotary_factor": 0.5}])
def test_inverse_frequencies_equal_transformers(rope):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = LlamaConfig(**BASE, rope_parameters=dict(rope))
    ref_inv, ref_scale = ROPE_INIT_FUNCTIONS[rope["rope_type"]](config, "cpu")
    params = rope_parameters({"rope_parameters": rope, **BASE})
    rot = int(8 * params.get("partial_rotary_factor", 1.0))
    ours_inv, ours_scale = inv_frequencies(params, rot, BASE["max_position_embeddings"])
    torch.testing.assert_close(ours_inv, ref_inv.float(), rtol=1e-6, atol=0)
    assert math.isclose(ours_scale, ref_scale, rel_tol=1e-9)


def test_legacy_rope_scaling_format_is_understood():
    params = rope_parameters({"rope_theta": 5e5, "rope_scaling": {"type": "linear", "factor": 2.0}})
    assert params["rope_type"] == "linear" and params["rope_theta"] == 5e5 and params["factor"] == 2.0


def test_unknown_rope_type_is_refused():
    with pytest.raises(ValueError, match="unsupported rope_type 'dynamic-ish'"):
        inv_frequencies({"rope_theta": 1e4, "rope_type": "dynamic-ish"}, 8, 64)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_runs_close_to_fp32(dtype):
    from agents.runtime.testing.make_model import cached_model

    path = cached_model("llama")
    lengths = [6, 3]
    ids = torch.arange(1, 10)
    positions = torch.cat([torch.arange(n) for n in lengths])
    ctx = ForwardContext.for_prompts(lengths)
    full = load_model(path).model
    half = load_model(path, dtype=dtype).model
    ref = full.compute_logits(full.forward(ids, positions, ctx).hidden)
    hidden = half.forward(ids, positions, ctx).hidden
    assert hidden.dtype == getattr(torch, dtype)
    got = half.compute_logits(hidden)
    assert got.dtype == torch.float32  # logits are handed to sampling in fp32 whatever the model dtype
    assert torch.nn.functional.cosine_similarity(got.float(), ref, dim=-1).min() > 0.99
    assert greedy_decode(half, [ids[:6].tolist()], 4, block_size=4)[0]  # the paged path runs in half precision


def test_qwen3_moe_with_dense_layers_and_unnormalised_routing_matches_transformers(tmp_path):
    from transformers import Qwen3MoeConfig

    config = Qwen3MoeConfig(**{**BASE, "num_hidden_layers": 3}, head_dim=16, num_experts=4, num_experts_per_tok=2,
                            moe_intermediate_size=24, norm_topk_prob=False, mlp_only_layers=[1])
    _compare(_save(tmp_path, config))


def test_mixtral_with_sliding_window_matches_transformers(tmp_path):
    from transformers import MixtralConfig

    _compare(_save(tmp_path, MixtralConfig(**BASE, num_local_experts=4, num_experts_per_tok=2, sliding_window=6)))
