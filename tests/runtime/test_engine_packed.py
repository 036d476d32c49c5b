"""Weights packed for oneDNN (``EngineConfig.pack_weights``): the same greedy tokens as the plain layout, the
packed tensors in place of the originals (never a second copy), and a packed model refuses a reload."""

from __future__ import annotations

import pytest
import torch

from agents.runtime.engine import LLMEngine, SamplingParams
from agents.runtime.engine.config import EngineConfig
from agents.runtime.layers import linear
from agents.runtime.testing.make_model import cached_model

PROMPTS = [[5, 9, 11], list(range(20, 57)), [7] * 12]
PARAMS = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


@pytest.fixture
def pack_small(monkeypatch):
    """The tiny models' weights are below the size worth packing; pack them all here."""
    monkeypatch.setattr(linear, "ONEDNN_MIN_WEIGHT", 0)


@pytest.mark.skipif(not linear._ONEDNN, reason="torch built without oneDNN")
@pytest.mark.parametrize("arch", ["llama", "qwen3-moe"])
def test_packed_weights_give_the_same_greedy_tokens(pack_small, arch):
    path = cached_model(arch)
    plain = LLMEngine(path, num_blocks=64)
    packed = LLMEngine(path, num_blocks=64, pack_weights=True)
    names = [n for n, _ in plain.model.named_parameters()]
    assert [n for n, _ in packed.model.named_parameters()] == names  # the same parameters, no extra copy
    mkldnn = {n for n, p in packed.model.named_parameters() if p.is_mkldnn}
    assert mkldnn and all(n.startswith("model.layers.") and n.endswith("_proj.weight") or n == "lm_head.weight"
                          for n in mkldnn)
    assert "lm_head.weight" in mkldnn  # untied: the LM head is packed too
    assert not any(n.endswith("experts.w13") for n in mkldnn)
    want = [o.output_token_ids for o in plain.generate(PROMPTS, PARAMS)]
    assert [o.output_token_ids for o in packed.generate(PROMPTS, PARAMS)] == want


@pytest.mark.skipif(not linear._ONEDNN, reason="torch built without oneDNN")
def test_a_tied_lm_head_stays_the_embedding_table(pack_small):
    engine = LLMEngine(cached_model("qwen3"), num_blocks=32, pack_weights=True)  # tie_word_embeddings
    model = engine.model
    assert model.lm_head.weight is model.model.embed_tokens.weight and not model.lm_head.weight.is_mkldnn
    assert any(p.is_mkldnn for p in model.parameters())
    assert len(engine.generate([[5, 6, 7]], PARAMS)[0].output_token_ids) == PARAMS.max_tokens


@pytest.mark.skipif(not linear._ONEDNN, reason="torch built without oneDNN")
def test_packed_model_refuses_a_reload(pack_small):
    engine = LLMEngine(cached_model("llama"), num_blocks=16, pack_weights=True)
    name, param = next((n, p) for n, p in engine.model.named_parameters() if p.is_mkldnn)
    checkpoint = engine.model.mapping.checkpoint_name(name, param.shards[0])
    with pytest.raises(RuntimeError, match="packed for oneDNN"):
        engine.model.load_weights([(checkpoint, torch.zeros(param.checkpoint_shape(param.shards[0])))])


def test_pack_weights_and_compile_exclude_each_other():
    with pytest.raises(ValueError, match="pack_weights and compile"):
        EngineConfig(pack_weights=True, compile=True)


def test_day0_serve_packs_fp32_cpu_weights_unless_told_or_compiled():
    import argparse

    from agents.runtime.commands.serve import packs_by_default, register

    assert packs_by_default("float32", "cpu", False)
    assert not packs_by_default("float32", "cpu", True)  # the compiled path traces plain weights
    assert not packs_by_default("bfloat16", "cpu", False)
    assert not packs_by_default("float32", "cuda:0", False)
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    assert parser.parse_args(["serve", "m"]).pack_weights is None  # auto
    assert parser.parse_args(["serve", "m", "--pack-weights"]).pack_weights is True
    assert parser.parse_args(["serve", "m", "--no-pack-weights"]).pack_weights is False
