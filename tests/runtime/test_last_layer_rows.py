"""A prefill step reads the final hidden states of each sampling sequence's last token only: the native decoder
runs its last layer's output projection and MLP on those rows alone (``ForwardContext.sample_rows``), and every
token's keys and values are still cached, so the outputs are those of the whole forward."""

from __future__ import annotations

import pytest
import torch

from agents.runtime.context import ForwardContext
from agents.runtime.engine import LLMEngine, SamplingParams
from agents.runtime.loader import load_model
from agents.runtime.testing.make_model import cached_model

ARCHES = ["llama", "qwen3-moe", "deepseek-v3", "mixtral"]
PROMPTS = ["Hello world, this is a test of", "The quick brown fox", "a " * 40, "Once upon a time there"]


@pytest.mark.parametrize("arch", ARCHES)
def test_the_last_layer_on_the_sampled_rows_equals_the_whole_forward(arch):
    model = load_model(cached_model(arch), stats=False).model
    lengths = [5, 1, 9]
    total = sum(lengths)
    ids = torch.randint(4, model.config["vocab_size"], (total,), generator=torch.Generator().manual_seed(0))
    pos = torch.cat([torch.arange(n) for n in lengths])
    whole = model.forward(ids, pos, ForwardContext.for_prompts(lengths))
    ctx = ForwardContext.for_prompts(lengths)
    ctx.sample_rows = (ctx.cu_seqlens_q[1:] - 1).long()  # each prompt's last token: [3]
    picked = model.forward(ids, pos, ctx)
    assert whole.rows is None and whole.hidden.shape[0] == total
    assert picked.rows is not None and picked.hidden.shape[0] == len(lengths)
    torch.testing.assert_close(picked.hidden, whole.hidden[ctx.sample_rows], rtol=1e-5, atol=1e-5)
    asked = model.forward(ids, pos, ctx, output_hidden_states=True)  # per-layer states asked: every row
    assert asked.rows is None and asked.hidden.shape[0] == total


def _run(engine: LLMEngine, params: SamplingParams) -> list[tuple[list[int], list[float]]]:
    """Every prompt's greedy tokens and their logprobs, collected step by step."""
    ids = [engine.add_request(p, params) for p in PROMPTS]
    tokens: dict[str, list[int]] = {i: [] for i in ids}
    logprobs: dict[str, list[float]] = {i: [] for i in ids}
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids
            logprobs[out.request_id] += [lp.logprob for lp in out.new_logprobs or []]
    return [(tokens[i], logprobs[i]) for i in ids]


@pytest.mark.parametrize("arch", ["llama", "qwen3-moe", "deepseek-v3"])
def test_engine_outputs_are_unchanged_by_computing_the_sampled_rows_only(arch):
    """Chunked prefills mixed with decodes (budget 24): the tokens and their logprobs equal the whole forward's."""
    engine = LLMEngine(cached_model(arch), num_blocks=96, block_size=8, max_num_batched_tokens=24)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, logprobs=2)
    forward, picked_steps = engine.model.forward, []

    def recording(*args, **kwargs):  # which steps the model answered with the sampling rows only
        out = forward(*args, **kwargs)
        picked_steps.append(out.rows is not None)
        return out

    engine.model.forward = recording
    pruned = _run(engine, params)
    assert any(picked_steps) and not all(picked_steps)  # the prefill steps picked, the decode-only ones not
    engine.model.prune_last_layer = False
    picked_steps.clear()
    whole = _run(engine, params)
    assert not any(picked_steps)
    assert [t for t, _ in pruned] == [t for t, _ in whole]
    assert all(len(lp) == 12 for _, lp in pruned)
    for (_, a), (_, b) in zip(pruned, whole, strict=True):
        assert a == pytest.approx(b, abs=1e-4)


def test_prompt_logprobs_still_score_every_prompt_token():
    engine = LLMEngine(cached_model("llama"), num_blocks=64, block_size=8, max_num_batched_tokens=16)
    params = SamplingParams(max_tokens=2, temperature=0.0, prompt_logprobs=1)
    out = engine.generate([PROMPTS[2]], params)[0]
    assert len(out.prompt_logprobs) == out.num_prompt_tokens  # the first is None, every other scored
    assert out.prompt_logprobs[0] is None and all(p is not None for p in out.prompt_logprobs[1:])
