"""What evaluation harnesses need from the server, over real HTTP on the tiny native Llama: logprobs and
echo (equal to transformers' fp32 log-softmax on the same weights), prompt lists and token-id prompts, n,
chat logprobs, streaming with logprobs, model lookup, and parameters the runtime does not implement."""

from __future__ import annotations

import json
import math

import httpx
import pytest
import torch

from agents.runtime.engine import LLMEngine
from agents.runtime.server import create_app
from agents.runtime.server.launcher import ServerThread
from agents.runtime.testing.make_model import cached_model

MODEL = "tiny-llama"


@pytest.fixture(scope="module")
def model_dir():
    return cached_model("llama")


@pytest.fixture(scope="module")
def engine(model_dir):
    # small prefill chunks: prompt logprobs are gathered across several chunks
    return LLMEngine(model_dir, num_blocks=256, max_num_batched_tokens=8)


@pytest.fixture(scope="module")
def url(engine):
    with ServerThread(create_app(engine, MODEL)) as base:
        yield base


@pytest.fixture(scope="module")
def reference(model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()

    def log_softmax(ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)  # [T, V]

    return log_softmax


def post(url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, timeout=60)


def events(resp: httpx.Response) -> list:
    return [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: ") and line[6:] != "[DONE]"]


def test_echo_logprobs_equal_the_reference_log_softmax(url, engine, reference):
    prompt = "Hello world, this is a test of the logprobs path"
    body = post(url, "/v1/completions", {"model": MODEL, "prompt": prompt, "echo": True, "logprobs": 3,
                                         "max_tokens": 4, "temperature": 0, "ignore_eos": True}).json()
    choice = body["choices"][0]
    lp = choice["logprobs"]
    ids = engine.tokenizer.encode(prompt)
    n = len(ids)
    assert choice["text"].startswith(prompt) and len(lp["tokens"]) == n + 4
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    generated: list[int] = []
    for _ in range(4):  # greedy on the reference (the engine's greedy tokens equal it: the alignment tests)
        generated.append(int(reference(ids + generated)[-1].argmax()))
    assert lp["tokens"][n:] == [engine.tokenizer.token_text(t) for t in generated]
    ref = reference(ids + generated[:3])
    for p in range(1, n + 4):
        token = (ids + generated)[p]
        assert lp["token_logprobs"][p] == pytest.approx(ref[p - 1, token].item(), abs=1e-4)
        best = ref[p - 1].topk(3)
        top = lp["top_logprobs"][p]
        expected: dict[str, float] = {}
        for tid, value in zip(best.indices.tolist(), best.values.tolist(), strict=True):
            expected.setdefault(engine.tokenizer.token_text(tid), value)  # two ids may share one text
        for text, value in expected.items():
            assert top[text] == pytest.approx(value, abs=1e-4)
    offsets = lp["text_offset"]
    assert offsets[0] == 0 and offsets == sorted(offsets)
    for p in range(1, n):  # each prompt token sits where its offset says (the BOS adds no text)
        assert choice["text"][offsets[p]:].startswith(lp["tokens"][p])
    assert body["usage"] == {"prompt_tokens": n, "completion_tokens": 4, "total_tokens": n + 4}


def test_loglikelihood_request_with_max_tokens_zero(url, engine, reference):
    """lm-eval's loglikelihood: token-id prompts, echo, max_tokens 0, a batch of prompts in one request."""
    batch = [engine.tokenizer.encode(t) for t in ("The capital of France is Paris", "One two three four")]
    body = post(url, "/v1/completions", {"prompt": batch, "echo": True, "logprobs": 1, "max_tokens": 0,
                                         "temperature": 0}).json()
    assert [c["index"] for c in body["choices"]] == [0, 1]
    for ids, choice in zip(batch, body["choices"], strict=True):
        assert choice["finish_reason"] == "length"
        lps = choice["logprobs"]["token_logprobs"]
        assert len(lps) == len(ids) and lps[0] is None
        ref = reference(ids)
        total = sum(ref[p - 1, ids[p]].item() for p in range(1, len(ids)))
        assert sum(lps[1:]) == pytest.approx(total, abs=1e-3)
        assert choice["text"] == engine.tokenizer.decode(ids)
    assert body["usage"]["completion_tokens"] == 0
    assert body["usage"]["prompt_tokens"] == sum(len(ids) for ids in batch)


def test_logprobs_zero_gives_the_chosen_token_only(url):
    body = post(url, "/v1/completions", {"prompt": "Hello", "logprobs": 0, "max_tokens": 3, "temperature": 0,
                                         "ignore_eos": True}).json()
    lp = body["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == 3 and all(len(top) == 1 for top in lp["top_logprobs"])
    assert all(top[tok] == value for tok, top, value in zip(lp["tokens"], lp["top_logprobs"], lp["token_logprobs"],
                                                             strict=True))
    assert all(v <= 0 for v in lp["token_logprobs"])


def test_prompt_lists_and_n_give_one_choice_each_in_order(url):
    prompts = ["Once upon a time", "The quick brown fox"]
    req = {"max_tokens": 5, "temperature": 0, "ignore_eos": True}
    alone = [post(url, "/v1/completions", {**req, "prompt": p}).json()["choices"][0]["text"] for p in prompts]
    body = post(url, "/v1/completions", {**req, "prompt": prompts, "n": 2}).json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    assert [c["text"] for c in body["choices"]] == [alone[0], alone[0], alone[1], alone[1]]
    assert body["usage"]["completion_tokens"] == 20
    sampled = post(url, "/v1/completions", {"prompt": "Once", "n": 3, "max_tokens": 8, "seed": 5,
                                            "ignore_eos": True}).json()
    again = post(url, "/v1/completions", {"prompt": "Once", "n": 3, "max_tokens": 8, "seed": 5,
                                          "ignore_eos": True}).json()
    texts = [c["text"] for c in sampled["choices"]]
    assert texts == [c["text"] for c in again["choices"]]  # seeded: reproducible
    assert len(set(texts)) > 1  # each choice draws with its own seed


def test_streamed_logprobs_and_echo_match_the_whole_response(url):
    req = {"prompt": "Streaming with logprobs", "echo": True, "logprobs": 2, "max_tokens": 6, "temperature": 0,
           "ignore_eos": True, "n": 2}
    whole = post(url, "/v1/completions", req).json()["choices"]
    with httpx.stream("POST", f"{url}/v1/completions", json={**req, "stream": True}, timeout=60) as resp:
        chunks = [e["choices"][0] for e in events(resp)]
    for index in (0, 1):
        mine = [c for c in chunks if c["index"] == index]
        assert "".join(c["text"] for c in mine) == whole[index]["text"]
        merged = {k: [v for c in mine for v in c["logprobs"][k]] for k in ("tokens", "token_logprobs",
                                                                        "text_offset")}
        want = whole[index]["logprobs"]
        assert merged["tokens"] == want["tokens"] and merged["text_offset"] == want["text_offset"]
        # the two requests batch their choices differently: equal up to float reassociation
        assert merged["token_logprobs"][0] is None and want["token_logprobs"][0] is None
        assert merged["token_logprobs"][1:] == pytest.approx(want["token_logprobs"][1:], abs=1e-5)
        assert mine[-1]["finish_reason"] == "length"


def test_return_token_ids_gives_the_prompt_and_generated_ids_streamed_and_not(url, engine):
    """vLLM's ``return_token_ids``: a benchmark compares two servers' greedy tokens by id, not by text."""
    prompt = [1, 5, 9, 13, 17]
    req = {"prompt": prompt, "max_tokens": 6, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
    choice = post(url, "/v1/completions", req).json()["choices"][0]
    assert choice["prompt_token_ids"] == prompt
    assert len(choice["token_ids"]) == 6
    assert engine.tokenizer.decode(choice["token_ids"]) == choice["text"]
    with httpx.stream("POST", f"{url}/v1/completions", json={**req, "stream": True}, timeout=60) as resp:
        chunks = [e["choices"][0] for e in events(resp)]
    assert [c["prompt_token_ids"] for c in chunks if "prompt_token_ids" in c] == [prompt]  # once, first
    assert [t for c in chunks for t in c["token_ids"]] == choice["token_ids"]
    plain = post(url, "/v1/completions", {**req, "return_token_ids": False}).json()["choices"][0]
    assert "token_ids" not in plain and plain["text"] == choice["text"]
    chat = post(url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3,
                                             "temperature": 0, "ignore_eos": True, "return_token_ids": True})
    ids = chat.json()["choices"][0]
    assert len(ids["token_ids"]) == 3 and ids["prompt_token_ids"]
    bad = post(url, "/v1/completions", {**req, "return_token_ids": "yes"})
    assert bad.status_code == 400 and "return_token_ids" in bad.text


def test_return_tokens_as_token_ids_names_every_logprob_token_by_its_id(url):
    """vLLM's ``return_tokens_as_token_ids``: an endpoint client (endpoint align) reads exact ids, echo included."""
    prompt = [1, 5, 9, 13, 17]
    req = {"prompt": prompt, "max_tokens": 4, "temperature": 0, "ignore_eos": True, "logprobs": 3, "echo": True,
           "return_token_ids": True}
    choice = post(url, "/v1/completions", {**req, "return_tokens_as_token_ids": True}).json()["choices"][0]
    block = choice["logprobs"]
    assert block["tokens"] == [f"token_id:{t}" for t in prompt + choice["token_ids"]]
    assert all(k.startswith("token_id:") for top in block["top_logprobs"] if top for k in top)
    plain = post(url, "/v1/completions", req).json()["choices"][0]["logprobs"]
    assert plain["token_logprobs"] == block["token_logprobs"]  # the same numbers, named by text
    bad = post(url, "/v1/completions", {**req, "return_tokens_as_token_ids": "yes"})
    assert bad.status_code == 400 and "return_tokens_as_token_ids" in bad.text


def test_chat_logprobs_in_the_chat_format(url, engine, reference):
    messages = [{"role": "user", "content": "Say something"}]
    req = {"messages": messages, "logprobs": True, "top_logprobs": 2, "max_tokens": 4, "temperature": 0,
           "ignore_eos": True}
    body = post(url, "/v1/chat/completions", req).json()
    content = body["choices"][0]["logprobs"]["content"]
    assert len(content) == 4
    for entry in content:
        assert entry["logprob"] <= 0 and entry["bytes"] == list(entry["token"].encode())
        assert len(entry["top_logprobs"]) == 2
        assert entry["top_logprobs"][0]["logprob"] >= entry["top_logprobs"][1]["logprob"]
    ids = engine.tokenizer.encode_chat(messages)
    ref = reference(ids)
    assert content[0]["logprob"] == pytest.approx(ref[-1].max().item(), abs=1e-4)  # greedy: the best token
    with httpx.stream("POST", f"{url}/v1/chat/completions", json={**req, "stream": True}, timeout=60) as resp:
        streamed = [e for c in events(resp) for e in ((c["choices"][0].get("logprobs") or {}).get("content") or [])]
    assert [e["token"] for e in streamed] == [e["token"] for e in content]
    plain = post(url, "/v1/chat/completions", {"messages": messages, "max_tokens": 2}).json()
    assert plain["choices"][0]["logprobs"] is None


def test_model_lookup_and_unknown_model_404(url):
    card = httpx.get(f"{url}/v1/models/{MODEL}").json()
    assert card["id"] == MODEL and card["object"] == "model"
    r = httpx.get(f"{url}/v1/models/gpt-4")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = post(url, "/v1/completions", {"model": "gpt-4", "prompt": "hi"})
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"


@pytest.mark.parametrize(
    ("path", "extra", "param"),
    [
        ("/v1/completions", {"presence_penalty": 2.5}, "presence_penalty"),
        ("/v1/completions", {"frequency_penalty": -3}, "frequency_penalty"),
        ("/v1/completions", {"repetition_penalty": 0}, "repetition_penalty"),
        ("/v1/completions", {"min_p": 1.5}, "min_p"),
        ("/v1/completions", {"min_tokens": 5}, "min_tokens"),
        ("/v1/completions", {"logit_bias": {"5": 101}}, "logit_bias"),
        ("/v1/completions", {"logit_bias": {"x": 1}}, "logit_bias"),
        ("/v1/completions", {"logit_bias": {"99999999": 1}}, "logit_bias"),
        ("/v1/completions", {"response_format": {"type": "xml"}}, "response_format"),
        ("/v1/completions", {"suffix": "tail"}, "suffix"),
        ("/v1/completions", {"best_of": 3}, "best_of"),
        ("/v1/completions", {"logprobs": 21}, "logprobs"),
        ("/v1/completions", {"logprobs": True}, "logprobs"),
        ("/v1/completions", {"echo": "yes"}, "echo"),
        ("/v1/completions", {"n": 0}, "n"),
        ("/v1/completions", {"mystery": 1}, "mystery"),
        ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),  # no format
        ("/v1/chat/completions", {"tool_choice": "auto"}, "tool_choice"),
        ("/v1/chat/completions", {"response_format": {"type": "xml"}}, "response_format"),
        ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {
            "name": "bad", "schema": {"type": "no-such-type"}}}}, "response_format"),
        ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs"),
        ("/v1/chat/completions", {"logprobs": 1}, "logprobs"),
        ("/v1/chat/completions", {"echo": True}, "echo"),
    ],
)
def test_unimplemented_or_out_of_range_parameters_are_named(url, path, extra, param):
    base = {"prompt": "hi"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "hi"}]}
    r = post(url, path, {**base, **extra, "max_tokens": 2})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and param in r.json()["error"]["message"]


def test_neutral_values_of_unimplemented_parameters_are_accepted(url):
    body = {"prompt": "hi", "max_tokens": 2, "presence_penalty": 0, "frequency_penalty": 0.0, "logit_bias": {},
            "best_of": 1, "suffix": None, "user": "me"}
    assert post(url, "/v1/completions", body).status_code == 200
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "tools": [], "tool_choice": "none",
            "response_format": {"type": "text"}}
    assert post(url, "/v1/chat/completions", chat).status_code == 200


def test_logprob_values_are_finite_json(url):
    body = post(url, "/v1/completions", {"prompt": "x", "logprobs": 20, "max_tokens": 2, "temperature": 0}).json()
    for top in body["choices"][0]["logprobs"]["top_logprobs"]:
        assert 1 <= len(top) <= 21 and all(math.isfinite(v) for v in top.values())  # ids may share a text


@pytest.mark.slow  # two processes load the model
def test_prompt_logprobs_under_tensor_parallelism_equal_one_process(url, tmp_path):
    """Every rank computes the prompt rows' logits (the LM head gathers across ranks): the echoed logprobs of
    ``day0 serve --tp 2`` equal a single process's."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from agents.runtime.server.launcher import free_port
    from tests.runtime.served import wait_until_ready

    req = {"prompt": ["Tensor parallel logprobs", "and a second prompt"], "echo": True, "logprobs": 2,
           "max_tokens": 3, "temperature": 0, "ignore_eos": True}
    alone = post(url, "/v1/completions", req).json()["choices"]
    port = free_port()
    log = tmp_path / "serve.log"
    repo = Path(__file__).resolve().parents[2]
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "day0cli", "serve", str(cached_model("llama")), "--tp",
                                 "2", "--port", str(port), "--num-blocks", "64", "--max-num-batched-tokens", "8"],
                                stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"},
                                cwd=repo)
    try:
        wait_until_ready(f"http://127.0.0.1:{port}", proc, log)
        got = post(f"http://127.0.0.1:{port}", "/v1/completions", req).json()["choices"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    for a, b in zip(alone, got, strict=True):
        assert a["text"] == b["text"] and a["logprobs"]["tokens"] == b["logprobs"]["tokens"]
        assert a["logprobs"]["token_logprobs"][0] is None and b["logprobs"]["token_logprobs"][0] is None
        for x, y in zip(a["logprobs"]["token_logprobs"][1:], b["logprobs"]["token_logprobs"][1:], strict=True):
            assert x == pytest.approx(y, abs=1e-4)
