"""Native families against transformers on the same weights (fp32): logits, per-layer hidden states and
32 greedy tokens through the paged cache with chunked prefill."""

from __future__ import annotations

import pytest
import torch

from agents.runtime.context import ForwardContext
from agents.runtime.loader import load_model
from agents.runtime.models.simple_decode import greedy_decode
from agents.runtime.testing.make_model import cached_model

ARCHES = ["llama", "qwen3", "mixtral", "qwen3-moe"]
LENGTHS = [7, 3, 12, 1]


@pytest.fixture(scope="module", params=ARCHES)
def pair(request):
    from transformers import AutoModelForCausalLM

    path = cached_model(request.param)
    ours = load_model(path).model
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, ours.config["vocab_size"], (n,), generator=gen) for n in LENGTHS]
    return ours, ref, prompts


def test_native_path_is_used(pair):
    ours, _, _ = pair
    assert ours.path == "native"


def test_logits_and_layer_hidden_states_match_transformers(pair):
    ours, ref, prompts = pair
    ids = torch.cat(prompts)
    positions = torch.cat([torch.arange(len(p)) for p in prompts])
    out = ours.forward(ids, positions, ForwardContext.for_prompts(LENGTHS), output_hidden_states=True)
    logits = ours.compute_logits(out.hidden)  # [T, vocab]
    assert len(out.layer_hidden) == ours.num_layers
    start = 0
    for p in prompts:
        with torch.no_grad():
            r = ref(p[None], output_hidden_states=True)
        rows = slice(start, start + len(p))
        torch.testing.assert_close(logits[rows], r.logits[0], atol=1e-4, rtol=0)
        # transformers' last hidden state is after the final norm; the others are raw block outputs
        for i in range(ours.num_layers - 1):
            torch.testing.assert_close(out.layer_hidden[i][rows], r.hidden_states[i + 1][0], atol=1e-4, rtol=0)
        torch.testing.assert_close(out.hidden[rows], r.hidden_states[-1][0], atol=1e-4, rtol=0)
        start += len(p)


def _reference_greedy(ref, prompt: torch.Tensor, steps: int) -> list[int]:
    seq = prompt[None]
    with torch.no_grad():
        for _ in range(steps):
            nxt = ref(seq).logits[0, -1].argmax()
            seq = torch.cat([seq, nxt.view(1, 1)], 1)
    return seq[0, len(prompt) :].tolist()


def test_32_greedy_tokens_through_paged_cache_match_transformers(pair):
    ours, ref, prompts = pair
    ours_out = greedy_decode(ours, [p.tolist() for p in prompts], 32, block_size=4, prefill_chunk=5)
    for prompt, tokens in zip(prompts, ours_out, strict=True):
        assert tokens == _reference_greedy(ref, prompt, 32)


@pytest.mark.parametrize("fused_kernel", [False, True], ids=["small-decode-matmuls", "fused-sdpa"])
def test_paged_incremental_logits_equal_full_recompute(pair, fused_kernel, monkeypatch):
    if fused_kernel:  # the path large decode batches take
        monkeypatch.setattr("agents.runtime.layers.attention.SMALL_DECODE", 0)
    ours, _, prompts = pair
    from agents.runtime.models.simple_decode import PagedCache, prefill_context

    prompt = prompts[2]
    cache = PagedCache(ours, 16, 1, block_size=4)
    ctx, pos = prefill_context(cache, [0], [0], [8])
    ours.forward(prompt[:8], pos, ctx)
    steps = []
    for i in range(8, len(prompt)):
        ctx, pos = prefill_context(cache, [0], [i], [1])
        steps.append(ours.compute_logits(ours.forward(prompt[i : i + 1], pos, ctx).hidden))
    full = ours.forward(prompt, torch.arange(len(prompt)), ForwardContext.for_prompts([len(prompt)]))
    full_logits = ours.compute_logits(full.hidden)[8:]
    torch.testing.assert_close(torch.cat(steps), full_logits, atol=1e-4, rtol=0)


def test_mixed_batch_of_decodes_and_a_prefill_chunk_equals_full_recompute(pair):
    ours, _, prompts = pair
    from agents.runtime.models.simple_decode import PagedCache, prefill_context

    a, b, c = prompts[0], prompts[2], prompts[1]  # lengths 7, 12, 3
    cache = PagedCache(ours, 16, 3, block_size=4)
    ctx, pos = prefill_context(cache, [0, 1], [0, 0], [6, 11])
    ours.forward(torch.cat([a[:6], b[:11]]), pos, ctx)
    # one step: two sequences decode one token each while the third prefills its whole prompt
    ctx, pos = prefill_context(cache, [0, 1, 2], [6, 11, 0], [1, 1, 3])
    assert not ctx.is_decode
    hidden = ours.forward(torch.cat([a[6:], b[11:], c]), pos, ctx).hidden
    step = ours.compute_logits(hidden)  # [5, vocab]
    for rows, seq in ((slice(0, 1), a), (slice(1, 2), b), (slice(2, 5), c)):
        full = ours.forward(seq, torch.arange(len(seq)), ForwardContext.for_prompts([len(seq)])).hidden
        expected = ours.compute_logits(full)[len(seq) - (rows.stop - rows.start) :]
        torch.testing.assert_close(step[rows], expected, atol=1e-4, rtol=0)


def test_equal_length_prompts_in_one_call_match_one_by_one_with_and_without_cache(pair):
    ours, ref, _ = pair
    from agents.runtime.models.simple_decode import PagedCache, prefill_context

    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, ours.config["vocab_size"], (6,), generator=gen) for _ in range(3)]
    ids = torch.cat(prompts)
    positions = torch.arange(6).repeat(3)
    no_cache = ours.compute_logits(ours.forward(ids, positions, ForwardContext.for_prompts([6, 6, 6])).hidden)
    cache = PagedCache(ours, 8, 3, block_size=4)
    ctx, pos = prefill_context(cache, [0, 1, 2], [0, 0, 0], [6, 6, 6])
    paged = ours.compute_logits(ours.forward(ids, pos, ctx).hidden)
    for i, p in enumerate(prompts):
        with torch.no_grad():
            expected = ref(p[None]).logits[0]
        torch.testing.assert_close(no_cache[6 * i : 6 * i + 6], expected, atol=1e-4, rtol=0)
        torch.testing.assert_close(paged[6 * i : 6 * i + 6], expected, atol=1e-4, rtol=0)
