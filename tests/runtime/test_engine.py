"""The engine on a real tiny Llama (native, paged) and on the transformers fallback (recompute path)."""

from __future__ import annotations

import json

import pytest
import torch

from agents.runtime.context import ForwardContext
from agents.runtime.engine import LLMEngine, RequestError, SamplingParams
from agents.runtime.testing.make_model import cached_model

GREEDY = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
PROMPTS = ["Hello world, this is a test of", "The quick brown fox", "a " * 70, "Once upon a time there"]


@pytest.fixture(scope="module")
def model_dir():
    return cached_model("llama")


@pytest.fixture(scope="module")
def engine(model_dir):
    return LLMEngine(model_dir, num_blocks=128, block_size=16, max_num_batched_tokens=48)


def _reference_greedy(model, prompt_ids: list[int], n: int) -> list[int]:
    """Greedy decoding by full recomputation without any cache."""
    ids = list(prompt_ids)
    with torch.inference_mode():
        for _ in range(n):
            hidden = model.forward(torch.tensor(ids), torch.arange(len(ids)), ForwardContext.for_prompts([len(ids)]))
            ids.append(int(model.compute_logits(hidden.hidden[-1:]).argmax(-1)))
    return ids[len(prompt_ids) :]


def test_batched_greedy_equals_alone_and_full_recomputation(engine):
    alone = [engine.generate([p], GREEDY)[0].output_token_ids for p in PROMPTS]
    together = engine.generate(PROMPTS, GREEDY)
    assert [o.output_token_ids for o in together] == alone
    ref = _reference_greedy(engine.model, engine.tokenizer.encode(PROMPTS[2]), 20)
    assert alone[2] == ref  # a 70-token prompt went through chunked prefill (budget 48)
    assert engine.stats()["kv_blocks_used"] == 0


def test_tight_pool_preempts_and_recomputes_without_changing_outputs(model_dir, engine):
    alone = [engine.generate([p], GREEDY)[0].output_token_ids for p in PROMPTS]
    tight = LLMEngine(model_dir, num_blocks=12, block_size=8, max_num_batched_tokens=32)
    outs = tight.generate(PROMPTS, GREEDY)
    assert [o.output_token_ids for o in outs] == alone
    stats = tight.stats()
    assert stats["num_preemptions"] > 0 and stats["kv_blocks_free"] == 12


def test_seeded_sampling_is_reproducible_in_any_batch(engine):
    params = SamplingParams(max_tokens=12, temperature=0.9, top_p=0.9, top_k=50, seed=1234)
    one = engine.generate([PROMPTS[0]], params)[0].output_token_ids
    many = engine.generate([PROMPTS[0], PROMPTS[1], PROMPTS[0]], [params, GREEDY, params])
    assert many[0].output_token_ids == one and many[2].output_token_ids == one
    other = engine.generate([PROMPTS[0]], SamplingParams(max_tokens=12, temperature=0.9, seed=99))[0]
    assert other.output_token_ids != one


def test_finish_reasons_stop_string_eos_and_length(engine):
    base = engine.generate([PROMPTS[1]], GREEDY)[0]
    assert base.finish_reason == "length" and base.num_output_tokens == 20
    target = base.text[len(base.text) // 2 :][:3]
    cut = engine.generate([PROMPTS[1]], SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True, stop=[target]))
    assert cut[0].finish_reason == "stop" and target not in cut[0].text
    assert base.text.startswith(cut[0].text)
    first = base.output_token_ids[3]
    eos = engine.generate([PROMPTS[1]], SamplingParams(max_tokens=20, temperature=0.0, stop_token_ids=[first]))
    assert eos[0].finish_reason == "stop" and eos[0].output_token_ids == base.output_token_ids[:4]


def test_abort_frees_blocks_at_the_next_step(engine):
    rid = engine.add_request(PROMPTS[2], SamplingParams(max_tokens=50, temperature=0.0, ignore_eos=True))
    engine.step()
    engine.step()
    assert engine.stats()["kv_blocks_used"] > 0
    engine.abort(rid)
    outs = engine.step()
    assert [(o.request_id, o.finish_reason) for o in outs] == [(rid, "abort")]
    assert engine.stats()["kv_blocks_used"] == 0 and not engine.has_unfinished()


@pytest.mark.parametrize(
    ("prompt", "params", "match"),
    [
        ("", SamplingParams(), "empty"),
        ([1, 2, 100_000], SamplingParams(), "token ids"),
        ("x " * 1100, SamplingParams(), "context"),
        ("hello", SamplingParams(max_tokens=1023), "exceeds"),
    ],
)
def test_bad_requests_are_refused_with_a_clear_message(engine, prompt, params, match):
    with pytest.raises(RequestError, match=match):
        engine.add_request(prompt, params)


def test_bad_sampling_params_name_the_field():
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=0)


@pytest.mark.parametrize("recompute", [False, True], ids=["paged", "recompute"])
def test_fallback_model_is_served_paged_or_by_recomputation(model_dir, engine, recompute):
    """The fallback runs on the paged KV cache where its attention can be routed there, and by recomputing the
    whole sequence each step when asked to (``recompute_only``): the same greedy tokens as the native model."""
    from safetensors.torch import load_file

    from agents.runtime.models.fallback import FallbackModel

    config = json.loads((model_dir / "config.json").read_text())
    model = FallbackModel(config)
    weights = {}
    for shard in sorted(model_dir.glob("*.safetensors")):
        weights.update(load_file(shard))
    model.load_weights(weights.items())
    model.eval()
    model.recompute_only = recompute
    fb = LLMEngine(model_dir, model=model, config=config, max_num_seqs=4)
    assert fb.runner.paged is not recompute
    outs = fb.generate(PROMPTS, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    native = engine.generate(PROMPTS, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    assert [o.output_token_ids for o in outs] == [o.output_token_ids for o in native]
    if recompute:
        assert fb.stats()["kv_blocks_used"] == 0


class _PoisonedModel:
    """The real model, except that any batch containing token 7 fails (a request the model cannot run)."""

    def __init__(self, model) -> None:
        self.model = model
        self.path = model.path

    def forward(self, input_ids, positions, ctx, output_hidden_states=False):
        if bool((input_ids == 7).any()):
            raise RuntimeError("poisoned token")
        return self.model.forward(input_ids, positions, ctx, output_hidden_states)

    def __getattr__(self, name):
        return getattr(self.model, name)


def test_a_failing_request_is_isolated_and_ends_alone(model_dir, engine):
    from agents.runtime.loader import load_model

    good = [engine.tokenizer.encode(p) for p in PROMPTS[:2]]
    expected = engine.generate(good, GREEDY)
    own = load_model(model_dir).model  # an engine binds its own cache to the model: never share one
    poisoned = LLMEngine(
        model_dir, model=_PoisonedModel(own), config=engine.model_config, num_blocks=64, max_num_batched_tokens=48
    )
    outs = poisoned.generate([good[0], [5, 6, 7, 8], good[1]], GREEDY)
    assert [o.finish_reason for o in outs] == ["length", "error", "length"]
    assert "poisoned token" in outs[1].error
    assert [outs[0].output_token_ids, outs[2].output_token_ids] == [o.output_token_ids for o in expected]
    assert poisoned.stats()["kv_blocks_used"] == 0


def test_fail_all_ends_every_request_and_frees_blocks(engine):
    ids = [engine.add_request(p, GREEDY) for p in PROMPTS]
    engine.step()
    outs = engine.fail_all("boom")
    assert sorted(o.request_id for o in outs) == sorted(ids)
    assert all(o.finished and o.finish_reason == "error" and o.error == "boom" for o in outs)
    assert engine.stats()["kv_blocks_used"] == 0 and not engine.has_unfinished()
