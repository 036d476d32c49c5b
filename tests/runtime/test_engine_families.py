"""Every native family through the paged engine: batched greedy output equals each prompt alone, the pool
drains (MLA caches its latent)."""

from __future__ import annotations

import pytest

from agents.runtime.engine import LLMEngine, SamplingParams
from agents.runtime.testing.make_model import cached_model

PROMPTS = ["Hello world, this is a test of", "The quick brown fox", "a " * 40]


@pytest.mark.parametrize(
    ("arch", "kind"), [("qwen3", "kv"), ("mixtral", "kv"), ("qwen3-moe", "kv"), ("deepseek-v3", "mla")]
)
def test_family_batched_equals_alone(arch, kind):
    engine = LLMEngine(cached_model(arch), num_blocks=48, max_num_batched_tokens=32)
    assert engine.model.kv_cache_spec().kind == kind
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    alone = [engine.generate([p], params)[0].output_token_ids for p in PROMPTS]
    assert [o.output_token_ids for o in engine.generate(PROMPTS, params)] == alone
    assert engine.stats()["kv_blocks_used"] == 0
