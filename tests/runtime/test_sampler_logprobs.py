"""Engine-level logprobs against transformers' fp32 log-softmax on the same weights: prompt logprobs gathered
over prefill chunks and kept once through preemptions, sampled-token logprobs, prefill-only requests."""

from __future__ import annotations

import pytest
import torch

from agents.runtime.engine import LLMEngine, SamplingParams
from agents.runtime.testing.make_model import cached_model


@pytest.fixture(scope="module")
def reference():
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(cached_model("llama"), dtype=torch.float32).eval()

    def log_softmax(ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)  # [T, V]

    return log_softmax


def test_prompt_and_token_logprobs_survive_chunking_and_preemption(reference):
    # 6 blocks of 16 tokens for three 56-token sequences: the scheduler must preempt and recompute
    engine = LLMEngine(cached_model("llama"), num_blocks=6, max_num_batched_tokens=8)
    prompts = [[(7 * i + 3 * j) % 500 + 2 for j in range(36)] for i in range(3)]
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True, logprobs=2, prompt_logprobs=1)
    outs = engine.generate(prompts, params)
    assert engine.scheduler.num_preemptions > 0
    for prompt, out in zip(prompts, outs, strict=True):
        full = prompt + out.output_token_ids
        ref = reference(full)
        plp = out.prompt_logprobs
        assert plp is not None and len(plp) == len(prompt) and plp[0] is None
        for p in range(1, len(prompt)):
            assert plp[p].token_id == prompt[p]
            assert plp[p].logprob == pytest.approx(ref[p - 1, prompt[p]].item(), abs=1e-4)
            assert plp[p].top[0][0] == int(ref[p - 1].argmax())
    assert engine.stats()["kv_blocks_used"] == 0


def test_sampled_token_logprobs_and_a_prefill_only_request(reference):
    engine = LLMEngine(cached_model("llama"), num_blocks=32)
    prompt = [5, 17, 42, 7, 99, 3]
    rid = engine.add_request(prompt, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, logprobs=3))
    tokens, lps = [], []
    while engine.has_unfinished():
        for out in engine.step():
            if out.request_id == rid:
                tokens += out.new_token_ids
                lps += out.new_logprobs or []
    ref = reference(prompt + tokens)
    for i, (token, lp) in enumerate(zip(tokens, lps, strict=True)):
        row = ref[len(prompt) - 1 + i]
        assert lp.token_id == token == int(row.argmax())
        assert lp.logprob == pytest.approx(row[token].item(), abs=1e-4)
        assert [t for t, _ in lp.top] == row.topk(3).indices.tolist()
    only = engine.generate([prompt], SamplingParams(max_tokens=0, prompt_logprobs=0))[0]
    assert only.finish_reason == "length" and only.num_output_tokens == 0 and only.output_token_ids == []
    assert [lp.top for lp in only.prompt_logprobs[1:]] == [()] * (len(prompt) - 1)
