"""Prefix caching: the block manager's hashed, ref-counted, LRU-evicted blocks, and the engine's greedy output
unchanged by it (shared prefixes batched with other requests, under eviction pressure, shared within the step
that computes them, and forgotten when that step fails)."""

from __future__ import annotations

import re

import pytest
import torch

from agents.runtime.engine import LLMEngine, SamplingParams
from agents.runtime.engine.block_manager import BlockManager, block_hash
from agents.runtime.engine.multimodal import ImageInputs
from agents.runtime.engine.sequence import Sequence
from agents.runtime.testing.make_model import cached_model

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


def _seq(name: str, ids: list[int], **params) -> Sequence:
    return Sequence(name, ids, SamplingParams(**params))


def _run(bm: BlockManager, seq: Sequence) -> list[int]:
    """Admit ``seq`` as the scheduler does, 'compute' its prompt and name its full blocks; return the hits."""
    hits = bm.lookup(seq)
    bm.take(seq, hits)
    bm.allocate(seq, seq.num_tokens)
    seq.num_computed_tokens = seq.num_tokens
    bm.register(seq)
    return hits


def test_a_shared_prefix_hits_its_full_blocks_and_holds_them_by_reference():
    bm = BlockManager(num_blocks=16, block_size=4, enable_prefix_caching=True)
    a = _seq("a", list(range(1, 11)))  # 10 tokens: blocks [1-4] [5-8] full, [9-10] partial
    assert _run(bm, a) == []
    assert bm.num_cached_blocks == 2
    b = _seq("b", [*range(1, 9), 50, 51, 52, 53])  # same first 8 tokens, its own full third block
    hits = _run(bm, b)
    assert hits == a.block_table[:2] and b.num_cached_tokens == 8 and b.block_table[2] != a.block_table[2]
    assert bm.num_hits == 8 and bm.num_queries == 22
    bm.free(a)
    assert bm.num_used_blocks == 3  # b still holds the two shared blocks and its own third
    b_blocks = list(b.block_table)
    bm.free(b)
    assert bm.num_free_blocks == 16 and bm.num_cached_blocks == 3  # kept: still reusable once free
    c = _seq("c", [*range(1, 9), 50, 51, 52, 53, 54])
    assert _run(bm, c) == b_blocks and c.num_cached_tokens == 12  # b's own full third block too


def test_a_different_first_block_shares_nothing_though_later_tokens_match():
    bm = BlockManager(num_blocks=16, block_size=4, enable_prefix_caching=True)
    _run(bm, _seq("a", list(range(1, 13))))
    other = _seq("b", [9, *range(2, 13)])  # block 2 and 3 equal, block 1 not: chained hashes differ
    assert bm.lookup(other) == []
    assert block_hash(b"", [1, 2, 3, 4]) != block_hash(b"x", [1, 2, 3, 4])


def test_the_last_token_is_always_computed():
    bm = BlockManager(num_blocks=16, block_size=4, enable_prefix_caching=True)
    _run(bm, _seq("a", list(range(1, 13))))
    same = _seq("b", list(range(1, 9)))  # exactly two full blocks, both cached
    hits = bm.lookup(same)
    assert len(hits) == 1  # the second block holds the last token: its logits are needed
    bm.take(same, hits)
    assert same.num_uncomputed_tokens == 4


def test_freed_blocks_are_evicted_least_recently_freed_first_and_unhashed_ones_before_them():
    bm = BlockManager(num_blocks=6, block_size=2, enable_prefix_caching=True)
    old = _seq("old", [1, 2, 3, 4, 5])  # two full blocks + one partial
    _run(bm, old)
    bm.free(old)
    new = _seq("new", [7, 8, 9, 10, 11])
    _run(bm, new)
    bm.free(new)
    assert bm.num_cached_blocks == 4 and bm.num_evictions == 0  # the partial blocks were taken first
    hog = _seq("hog", [20, 21, 22, 23, 24, 25, 26, 27])  # 4 blocks: 2 free + the 2 oldest hashed
    bm.allocate(hog, 8)
    assert bm.num_evictions == 2
    assert bm.lookup(_seq("x", [1, 2, 3, 4, 5])) == []  # the older prefix is gone
    assert len(bm.lookup(_seq("y", [7, 8, 9, 10, 11]))) == 2  # the newer one stays


def test_a_block_another_request_holds_is_never_evicted():
    bm = BlockManager(num_blocks=4, block_size=2, enable_prefix_caching=True)
    a = _seq("a", [1, 2, 3, 4, 5])
    _run(bm, a)
    hog = _seq("hog", [9, 9])
    bm.allocate(hog, 2)
    with pytest.raises(RuntimeError, match="out of KV blocks"):
        bm.allocate(hog, 4)
    assert bm.num_evictions == 0 and len(bm.lookup(_seq("b", [1, 2, 3, 4, 7]))) == 2


def test_off_and_prompt_logprobs_and_images_do_not_share():
    off = BlockManager(num_blocks=8, block_size=2)
    _run(off, _seq("a", [1, 2, 3, 4, 5]))
    assert off.num_cached_blocks == 0 and off.lookup(_seq("b", [1, 2, 3, 4, 5])) == []
    bm = BlockManager(num_blocks=16, block_size=2, enable_prefix_caching=True)
    _run(bm, _seq("a", [1, 2, 3, 4, 5]))
    assert bm.lookup(_seq("lp", [1, 2, 3, 4, 5], prompt_logprobs=1)) == []  # every position's logits needed
    pixels = torch.rand(1, 3, 4, 4)
    shown = _seq("img", [1, 2, 3, 4, 5])
    shown.images = ImageInputs(pixels, [1])
    assert bm.lookup(shown) == []  # text-only blocks do not match an image prompt with the same ids
    _run(bm, shown)
    again = _seq("img2", [1, 2, 3, 4, 5])
    again.images = ImageInputs(pixels.clone(), [1])
    assert len(bm.lookup(again)) == 2  # the same pixels do
    other = _seq("img3", [1, 2, 3, 4, 5])
    other.images = ImageInputs(pixels + 1, [1])
    assert bm.lookup(other) == []  # other pixels behind the same placeholder ids do not


@pytest.fixture(scope="module")
def model_dir():
    return cached_model("llama")


def _prompts(engine: LLMEngine) -> list[list[int]]:
    """A 40-token shared head (a system prompt) under three different questions, and an unrelated prompt."""
    head = engine.tokenizer.encode("You are a helpful assistant. Answer briefly and " * 4)[:40]
    tails = ["What is a cat?", "Name a colour.", "Count to three, please, slowly"]
    return [head + engine.tokenizer.encode(t, add_special_tokens=False) for t in tails] + [
        engine.tokenizer.encode("The quick brown fox")
    ]


@pytest.mark.parametrize("num_blocks", [128, 14])  # ample, and a pool that evicts and preempts
def test_greedy_output_is_identical_with_prefix_caching_on_and_off(model_dir, num_blocks):
    settings = dict(num_blocks=num_blocks, block_size=8, max_num_batched_tokens=32)
    off = LLMEngine(model_dir, **settings)
    on = LLMEngine(model_dir, enable_prefix_caching=True, **settings)
    prompts = _prompts(on)
    expected = [o.output_token_ids for o in off.generate(prompts, GREEDY)]
    first = on.generate(prompts[:1], GREEDY)[0].output_token_ids  # fills the cache with the shared head
    assert first == expected[0]
    batched = on.generate(prompts, GREEDY)  # every shared-head prompt hits, batched with the unrelated one
    assert [o.output_token_ids for o in batched] == expected
    again = on.generate(list(reversed(prompts)), GREEDY)
    assert [o.output_token_ids for o in again] == list(reversed(expected))
    stats = on.stats()
    assert stats["prefix_caching"] == 1 and stats["prefix_cache_hits"] >= 3 * 40 - 8
    assert 0 < stats["prefix_cache_hits"] < stats["prefix_cache_queries"]
    assert stats["kv_blocks_used"] == 0 and off.stats()["prefix_cache_hits"] == 0
    if num_blocks == 14:
        assert stats["prefix_cache_evictions"] > 0


def test_day0_serve_flag_reaches_the_engine_and_metrics_count_hits(model_dir, monkeypatch):
    import argparse

    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    from agents.runtime.commands import serve as serve_cmd
    from agents.runtime.server import create_app, launcher
    from agents.runtime.server.launcher import ServerThread

    parser = argparse.ArgumentParser()
    serve_cmd.register(parser.add_subparsers())
    assert parser.parse_args(["serve", "m"]).enable_prefix_caching is False
    args = parser.parse_args(["serve", str(model_dir), "--enable-prefix-caching", "--allocator", "system"])
    seen: dict = {}
    monkeypatch.setattr(launcher, "serve", lambda model, **kw: seen.update(kw) or 0)
    assert serve_cmd.handle(args) == 0 and seen["enable_prefix_caching"] is True

    engine = LLMEngine(model_dir, num_blocks=64, block_size=8, enable_prefix_caching=True)
    head = "You are a careful assistant who answers in one short sentence. " * 2
    with ServerThread(create_app(engine, "tiny")) as url:
        for tail in ("What is a cat?", "Name a colour."):
            body = {"prompt": head + tail, "max_tokens": 3, "temperature": 0}
            assert httpx.post(f"{url}/v1/completions", json=body, timeout=60).status_code == 200
        text = httpx.get(f"{url}/metrics", timeout=10).text
    found = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert found["vllm:prefix_cache_hits_total"] >= 16  # the second prompt's shared full blocks
    assert found["vllm:prefix_cache_queries_total"] > found["vllm:prefix_cache_hits_total"]


@pytest.mark.slow  # two ranks load the model: ~20-60 s on a busy host
def test_tensor_parallel_ranks_share_cached_blocks_in_step(model_dir, tmp_path):
    """``day0 serve --tp 2 --enable-prefix-caching``: rank 0 schedules the cached blocks, the other rank reads
    the blocks it wrote itself when they were computed; the text equals one process without caching."""
    import os
    import subprocess
    import sys
    import time
    from pathlib import Path

    import httpx

    from agents.runtime.server.launcher import free_port

    head = "You are a careful assistant who answers in one short sentence. " * 3
    prompts = [head + "What is a cat?", head + "Name a colour.", head + "What is a cat?"]
    alone = [o.text for o in LLMEngine(model_dir, num_blocks=64).generate(prompts, GREEDY)]
    port, log = free_port(), open(tmp_path / "serve.log", "w")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "day0cli", "serve", str(model_dir), "--tp", "2", "--port",
                             str(port), "--num-blocks", "64", "--block-size", "8", "--enable-prefix-caching"],
                            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=Path(__file__).resolve().parents[2])
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-2000:]
        for prompt, expected in zip(prompts, alone, strict=True):
            body = {"prompt": prompt, "max_tokens": GREEDY.max_tokens, "temperature": 0, "ignore_eos": True}
            r = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
            assert r.status_code == 200 and r.json()["choices"][0]["text"] == expected
        hits = re.search(r'^vllm:prefix_cache_hits_total\{[^}]*\} (\S+)', httpx.get(f"{url}/metrics").text, re.M)
        assert hits and float(hits.group(1)) >= 2 * 40
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def test_packed_native_path_and_a_prompt_one_token_past_its_cached_blocks(model_dir):
    """fp32 weights packed (the native kernels' path); a 33-token prompt over 8-token blocks whose first four
    blocks are cached leaves one token to compute: it runs as a decode row and still draws the same tokens."""
    base = list(range(5, 37))
    prompts = [[*base, 40], [*base, 41, 42, 43], [*base[:16], *[7] * 9], [9, 8, 7]]
    outputs = {}
    for on in (False, True):
        engine = LLMEngine(model_dir, num_blocks=64, block_size=8, max_num_batched_tokens=32, pack_weights=True,
                           enable_prefix_caching=on)
        engine.generate([[*base, 99]], GREEDY)
        outputs[on] = [o.output_token_ids for o in engine.generate(prompts, GREEDY)]
        assert engine.stats()["prefix_cache_hits"] == (32 + 32 + 16 if on else 0)
    assert outputs[True] == outputs[False]


def test_requests_admitted_in_one_step_share_a_prefix_the_first_computes_in_that_step(model_dir):
    """Blocks are named when the step that computes them is scheduled (as vLLM does): requests admitted after
    the first in the same step take its prefix blocks and compute their own tails only, their attention reading
    the K/V the step writes before it; the same greedy tokens as without caching."""
    settings = dict(num_blocks=64, block_size=8, max_num_batched_tokens=256)
    head = list(range(5, 45))  # 40 tokens: 5 full blocks
    prompts = [[*head, 50 + i, 60 + i, 70 + i] for i in range(3)]
    off = [o.output_token_ids for o in LLMEngine(model_dir, **settings).generate(prompts, GREEDY)]
    engine = LLMEngine(model_dir, enable_prefix_caching=True, **settings)
    for i, p in enumerate(prompts):
        engine.add_request(p, GREEDY, request_id=str(i))
    engine.step()  # all three admitted and prefilled in this one step
    assert engine.stats()["prefix_cache_hits"] == 2 * 40 and engine.num_steps == 1
    final = {}
    while engine.has_unfinished():
        final.update({o.request_id: o.output_token_ids for o in engine.step() if o.finished})
    assert [final[str(i)] for i in range(3)] == off


def test_a_failed_step_forgets_the_blocks_named_for_it(model_dir, monkeypatch):
    """The forward pass of a step that named blocks fails: those names are dropped (their K/V may be missing),
    so nothing can hit them; the requests, retried, give the tokens of a run that never failed."""
    settings = dict(num_blocks=64, block_size=8, max_num_batched_tokens=256, enable_prefix_caching=True)
    prompts = [[*range(5, 45), 50], [*range(5, 45), 51]]
    want = [o.output_token_ids for o in LLMEngine(model_dir, **settings).generate(prompts, GREEDY)]
    engine = LLMEngine(model_dir, **settings)
    real = engine.runner.run_step
    calls = []

    def fail_once(batch):
        calls.append(len(batch.seqs))
        if len(calls) == 1:
            assert engine.blocks.num_cached_blocks == 5  # named at scheduling: the first prompt's full blocks
            raise RuntimeError("injected")
        return real(batch)

    monkeypatch.setattr(engine.runner, "run_step", fail_once)
    for i, p in enumerate(prompts):
        engine.add_request(p, GREEDY, request_id=str(i))
    engine.step()
    assert engine.blocks.num_cached_blocks == 0 and engine.blocks.num_used_blocks == 0
    final = {}
    while engine.has_unfinished():
        final.update({o.request_id: o for o in engine.step() if o.finished})
    assert [final[str(i)].output_token_ids for i in range(2)] == want and all(o.error is None for o in final.values())
