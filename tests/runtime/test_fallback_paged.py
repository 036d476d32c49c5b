"""The transformers fallback on the runtime's paged KV cache: a family the runtime has no code for decodes through
the paged cache, continuously batched with chunked prefill, with greedy tokens equal to transformers' own
``generate`` (GPT-NeoX; Gemma-3 with sliding-window layers; Gemma-2 with soft-capped logits); an architecture whose
attention cannot be routed (Bloom) keeps the recompute path and says why."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agents.runtime.engine import LLMEngine, SamplingParams
from agents.runtime.models.fallback import FallbackModel

NEW_TOKENS = 12
# different lengths; the long one spans several prefill chunks (8 tokens a step) and blocks (4 tokens each)
PROMPTS = [[5, 17, 42, 7, 99, 3, 11, 13, 200, 201, 4, 77, 31, 64, 250, 8, 9, 150, 23], [9, 8, 7]]


class _Ids:
    """Prompts given as token ids; nothing to detokenise (the test reads token ids only)."""

    eos_token_ids: set[int] = set()
    vocab_size = 320

    def encode(self, prompt, add_special_tokens=True):  # noqa: ANN001, ANN201, ARG002
        return list(prompt)

    def special_ids(self) -> list[int]:
        return []

    def decode(self, ids, **_):  # noqa: ANN001, ANN003, ANN201
        return ""


def _tiny(arch: str):  # noqa: ANN202 - a transformers model
    import transformers

    torch.manual_seed(0)
    common = {"vocab_size": 320, "max_position_embeddings": 128, "bos_token_id": 0, "eos_token_id": None}
    if arch == "GPTNeoXForCausalLM":  # partial rotary, parallel residual
        cfg = transformers.GPTNeoXConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                         intermediate_size=64, rotary_pct=0.5, **common)
    elif arch == "Gemma3ForCausalLM":  # GQA, q/k norms, sliding-window layers beside a global one, per-type rope
        cfg = transformers.Gemma3TextConfig(hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                                            num_key_value_heads=2, head_dim=8, intermediate_size=64, sliding_window=6,
                                            layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                                            pad_token_id=0, **common)
    elif arch == "Gemma2ForCausalLM":  # attention logits soft-capped; q/k scaled up so that the cap bites
        cfg = transformers.Gemma2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, head_dim=8, intermediate_size=64, pad_token_id=0,
                                        attn_logit_softcapping=2.0, sliding_window=6, **common)
        model = transformers.Gemma2ForCausalLM(cfg).eval()
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.q_proj.weight.mul_(20.0)
                layer.self_attn.k_proj.weight.mul_(20.0)
        return model
    else:  # BloomForCausalLM: ALiBi, attention not routed through the AttentionInterface
        cfg = transformers.BloomConfig(vocab_size=320, hidden_size=32, n_layer=2, n_head=4, bos_token_id=0,
                                       eos_token_id=None, pad_token_id=0)
    return getattr(transformers, arch)(cfg).eval()


def _saved(arch: str, tmp_path: Path):  # noqa: ANN202
    hf = _tiny(arch)
    hf.save_pretrained(tmp_path)
    return hf


def _engine(model_dir: Path) -> LLMEngine:
    from agents.runtime.loader import load_model

    result = load_model(model_dir, dtype="float32")
    assert result.report["path"] == "fallback"
    return LLMEngine(None, model=result.model, config=result.config, tokenizer=_Ids(), num_blocks=24, block_size=4,
                     max_num_batched_tokens=8)


def _reference(hf, prompt: list[int]) -> list[int]:  # noqa: ANN001
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0,
                          eos_token_id=None)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("arch", ["GPTNeoXForCausalLM", "Gemma3ForCausalLM", "Gemma2ForCausalLM"])
def test_a_fallback_family_decodes_batched_through_the_paged_cache_equal_to_transformers(arch, tmp_path) -> None:
    hf = _saved(arch, tmp_path)
    engine = _engine(tmp_path)
    model = engine.model
    assert isinstance(model, FallbackModel) and model.decode_path == "paged" and model.decode_reason is None
    assert engine.runner.paged and engine.scheduler.config.chunked_prefill
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    ids = [engine.add_request(p, params) for p in PROMPTS]
    final, batched, blocks_used = {}, 0, 0
    while len(final) < len(ids):
        before = len(engine.scheduler.running) + len(engine.scheduler.waiting) + len(engine._inbox)
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
        batched += before == 2 and len(engine.scheduler.running) == 2  # both ran in this step
        blocks_used = max(blocks_used, engine.blocks.num_used_blocks)
    for request_id, prompt in zip(ids, PROMPTS, strict=True):
        assert final[request_id].output_token_ids == _reference(hf, prompt)
    assert batched >= NEW_TOKENS - 1  # one forward pass served both requests, step after step
    # one step per prefill chunk of the long prompt, then one per token: never a step per request
    assert engine.num_steps <= -(-len(PROMPTS[0]) // 8) + NEW_TOKENS
    assert blocks_used >= -(-(len(PROMPTS[0]) + NEW_TOKENS - 1) // 4)  # its K/V sat in the paged blocks
    assert engine.blocks.num_free_blocks == engine.blocks.num_blocks


def test_an_alibi_family_keeps_the_recompute_path_and_says_why(tmp_path) -> None:
    hf = _saved("BloomForCausalLM", tmp_path)
    engine = _engine(tmp_path)
    model = engine.model
    assert model.decode_path == "recompute" and "AttentionInterface" in model.decode_reason
    assert model.kv_cache_spec() is None and not engine.runner.paged
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    outs = engine.generate(PROMPTS, params)
    assert [o.output_token_ids for o in outs] == [_reference(hf, p) for p in PROMPTS]


def test_a_model_that_ignores_position_ids_fails_the_self_check(tmp_path) -> None:
    """Rotary positions counted from 0 in every forward (as a model computing them from its own cache would):
    the chunked self-check sees the second chunk's queries and keys differ, and the model keeps recomputing."""
    _saved("GPTNeoXForCausalLM", tmp_path)
    import json

    model = FallbackModel(json.loads((tmp_path / "config.json").read_text()))
    rotary = model.hf_model.gpt_neox.rotary_emb
    forward = rotary.forward
    rotary.forward = lambda x, position_ids: forward(x, position_ids - position_ids[:, :1])
    assert model.kv_cache_spec() is None
    assert model.decode_path == "recompute" and "position_ids" in model.decode_reason


def test_the_old_path_stays_selectable_and_gives_the_same_tokens(tmp_path) -> None:
    hf = _saved("GPTNeoXForCausalLM", tmp_path)
    from agents.runtime.loader import load_model

    result = load_model(tmp_path, dtype="float32")
    result.model.recompute_only = True
    engine = LLMEngine(None, model=result.model, config=result.config, tokenizer=_Ids(), num_blocks=24, block_size=4)
    assert not engine.runner.paged and result.model.decode_path == "recompute"
    outs = engine.generate(PROMPTS, SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True))
    assert [o.output_token_ids for o in outs] == [_reference(hf, p) for p in PROMPTS]
