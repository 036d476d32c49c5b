"""Hostile and careless input to the runtime server over real HTTP: bodies over the limit, huge prompts,
loosely typed fields, nesting, lone surrogates, out-of-range integers; the API key, CORS and request ids."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest

from agents.runtime.engine import LLMEngine
from agents.runtime.server import create_app
from agents.runtime.server.launcher import ServerThread, build_server
from agents.runtime.testing.make_model import cached_model

CHAT = "/v1/chat/completions"
DONE_CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def engine():
    return LLMEngine(cached_model("llama"), num_blocks=128)


@pytest.fixture(scope="module")
def url(engine):
    with ServerThread(create_app(engine, "tiny-llama", max_body_bytes=4 * 2**20)) as base:
        yield base


def raw_post(url: str, path: str, raw: bytes, timeout: float = 30) -> httpx.Response:
    return httpx.post(f"{url}{path}", content=raw, headers={"content-type": "application/json"}, timeout=timeout)


def test_a_body_over_the_limit_is_a_413_before_it_is_read(url):
    """A 20 MB upload is refused from its Content-Length: the answer comes while the body is still unsent."""
    host, port = url.removeprefix("http://").split(":")
    started = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 20000000\r\n\r\n{\"prompt\": \"")
        answer = b""
        while b"}}" not in answer and (chunk := sock.recv(65536)):
            answer += chunk
        answer = answer.decode()
    assert answer.startswith("HTTP/1.1 413") and "over the limit" in answer
    assert time.monotonic() - started < 2


def test_a_chunked_body_over_the_limit_is_a_413(url):
    def chunks():
        yield b'{"prompt": "'
        for _ in range(80):  # 5 MiB
            yield b"x" * 65536

    r = httpx.post(f"{url}/v1/completions", content=chunks(), headers={"content-type": "application/json"},
                   timeout=30)
    assert r.status_code == 413


def test_a_huge_prompt_is_refused_at_once_and_health_stays_fast(url):
    prompt = "word " * 700_000  # 3.5 MB: under the body limit, far over the context (seconds to tokenize)
    latencies: list[float] = []
    done = threading.Event()

    def probe() -> None:
        while not done.is_set():
            t0 = time.monotonic()
            httpx.get(f"{url}/health", timeout=10)
            latencies.append(time.monotonic() - t0)

    thread = threading.Thread(target=probe)
    thread.start()
    try:
        for path, body in (("/v1/completions", {"prompt": prompt}),
                           (CHAT, {"messages": [{"role": "user", "content": prompt}]})):
            t0 = time.monotonic()
            r = httpx.post(f"{url}{path}", json=body, timeout=30)
            assert r.status_code == 400 and "context" in r.json()["error"]["message"], r.text
            assert time.monotonic() - t0 < 5
    finally:
        done.set()
        thread.join()
    assert latencies and max(latencies) < 2.0


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("stream", "yes"),
        ("stream", 1),
        ("ignore_eos", "true"),
        ("temperature", "0.5"),
        ("top_p", [1]),
        ("top_k", 1.5),
        ("seed", 2**70),
        ("seed", "7"),
        ("top_k", 2**70),
        ("max_tokens", 2**70),
        ("stop", [1, 2]),
        ("stop", ["x"] * 17),
        ("stop_token_ids", [2**40]),
        ("stream_options", {"include_usage": True}),  # without stream
        ("user", 5),
    ],
)
def test_loosely_typed_or_out_of_range_fields_are_400s_naming_them(url, field, value):
    for path, base in (("/v1/completions", {"prompt": "hi", "max_tokens": 2}), (CHAT, DONE_CHAT)):
        r = httpx.post(f"{url}{path}", json={**base, field: value}, timeout=30)
        assert r.status_code == 400, (path, r.text)
        assert r.json()["error"]["param"] == field, r.text


def test_seed_bounds_are_those_of_a_generator(url):
    for seed in (2**64 - 1, -(2**63), 0):
        r = httpx.post(f"{url}/v1/completions", json={"prompt": "hi", "max_tokens": 2, "seed": seed}, timeout=30)
        assert r.status_code == 200, r.text


@pytest.mark.parametrize("path", ["/v1/completions", CHAT])
def test_deep_nesting_nan_and_lone_surrogates_are_400s(url, path):
    deep = b'{"prompt": ' + b"[" * 1000 + b"]" * 1000 + b"}"
    assert raw_post(url, path, deep).status_code == 400
    assert raw_post(url, path, b"[" * 100_000 + b"]" * 100_000).status_code == 400
    assert raw_post(url, path, b'{"prompt": "hi", "messages": [], "temperature": NaN}').status_code == 400
    if path == CHAT:
        body = b'{"messages": [{"role": "user", "content": "bad \\ud800 text"}]}'
        param = "messages"
    else:
        body = b'{"prompt": "bad \\ud800 text"}'
        param = "prompt"
    r = raw_post(url, path, body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param and "surrogate" in r.json()["error"]["message"]
    assert raw_post(url, path, b"\xff\xfe not utf-8").status_code == 400


def test_request_id_is_echoed_and_names_the_completion(url):
    r = httpx.post(f"{url}/v1/completions", json={"prompt": "hi", "max_tokens": 2},
                   headers={"X-Request-Id": "trace-42.a:b"}, timeout=30)
    assert r.headers["x-request-id"] == "trace-42.a:b" and r.json()["id"] == "cmpl-trace-42.a:b"
    r = httpx.post(f"{url}{CHAT}", json=DONE_CHAT, timeout=30)
    generated = r.headers["x-request-id"]
    assert len(generated) == 32 and r.json()["id"] == f"chatcmpl-{generated}"
    with httpx.stream("POST", f"{url}/v1/completions", json={"prompt": "hi", "max_tokens": 2, "stream": True},
                      headers={"X-Request-Id": "s1"}, timeout=30) as resp:
        first = next(line for line in resp.iter_lines() if line.startswith("data: "))
        assert resp.headers["x-request-id"] == "s1" and json.loads(first[6:])["id"] == "cmpl-s1"
    assert httpx.get(f"{url}/health", headers={"X-Request-Id": "h"}).headers["x-request-id"] == "h"
    r = httpx.get(f"{url}/health", headers={"X-Request-Id": "x" * 129})
    assert r.status_code == 400 and r.json()["error"]["param"] == "X-Request-Id"
    # the same client id twice at once is fine: the engine keys requests by its own ids
    results: list[int] = []

    def post() -> None:
        results.append(httpx.post(f"{url}/v1/completions", json={"prompt": "hi", "max_tokens": 8},
                                  headers={"X-Request-Id": "same"}, timeout=30).status_code)

    threads = [threading.Thread(target=post) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [200, 200, 200]


def test_api_key_guards_v1_and_leaves_probes_open(engine, monkeypatch):
    monkeypatch.setenv("DAY0_API_KEY", "s3cret")
    server = build_server(cached_model("llama"), num_blocks=32, allowed_origins=["https://ui.example"])
    with ServerThread(server.config.app) as base:
        deadline = time.monotonic() + 60
        while httpx.get(f"{base}/ready").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert httpx.get(f"{base}/health").status_code == 200
        assert httpx.get(f"{base}/metrics").status_code == 200
        r = httpx.get(f"{base}/v1/models")
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        assert r.headers["www-authenticate"] == "Bearer"
        assert httpx.get(f"{base}/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
        ok = {"Authorization": "Bearer s3cret"}
        assert httpx.get(f"{base}/v1/models", headers=ok).status_code == 200
        r = httpx.post(f"{base}/v1/completions", json={"prompt": "hi", "max_tokens": 2}, headers=ok, timeout=30)
        assert r.status_code == 200
        # CORS: a preflight is answered without the key; answers carry the allowed origin
        pre = httpx.options(f"{base}/v1/completions", headers={
            "Origin": "https://ui.example", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type"})
        assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == "https://ui.example"
        assert "authorization" in pre.headers["access-control-allow-headers"].lower()
        r = httpx.get(f"{base}/v1/models", headers={**ok, "Origin": "https://ui.example"})
        assert r.headers["access-control-allow-origin"] == "https://ui.example"
        assert "x-request-id" in r.headers["access-control-expose-headers"].lower()
        other = httpx.options(f"{base}/v1/completions", headers={
            "Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
        assert other.status_code == 400 and "access-control-allow-origin" not in other.headers


def test_without_cors_configured_a_preflight_is_refused(url):
    r = httpx.options(f"{url}/v1/completions", headers={"Origin": "https://ui.example",
                                                        "Access-Control-Request-Method": "POST"})
    assert r.status_code == 405 and "access-control-allow-origin" not in r.headers


def test_a_bad_prompt_in_a_batch_is_named_and_nothing_of_the_batch_runs(url, engine):
    # the second prompt fits the context alone but not with its max_tokens: the engine refuses it on queueing
    r = httpx.post(f"{url}/v1/completions", json={"prompt": [[5, 6, 7], [5] * 1000], "max_tokens": 100}, timeout=30)
    assert r.status_code == 400 and "choice 1" in r.json()["error"]["message"], r.text
    deadline = time.monotonic() + 10  # choice 0 was queued before choice 1 was refused: it is aborted
    while (engine.stats()["kv_blocks_used"] or engine.stats()["num_running"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.stats()["kv_blocks_used"] == 0 and engine.stats()["num_running"] == 0


def test_a_token_id_prompt_longer_than_the_context_is_refused_at_once(url):
    t0 = time.monotonic()
    r = httpx.post(f"{url}/v1/completions", json={"prompt": [5] * 150_000, "echo": True, "max_tokens": 1}, timeout=30)
    assert r.status_code == 400 and "context" in r.json()["error"]["message"] and r.json()["error"]["param"] == "prompt"
    assert time.monotonic() - t0 < 5
    for bad in ([5, -1], [5, 2**40], [5, 10**6]):
        r = httpx.post(f"{url}/v1/completions", json={"prompt": bad, "echo": True, "max_tokens": 1}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text


def test_day0_bench_sends_the_api_key_and_says_when_one_is_needed(engine, monkeypatch):
    from agents.runtime.bench import run_benchmark

    monkeypatch.setenv("DAY0_API_KEY", "s3cret")
    server = build_server(cached_model("llama"), num_blocks=32)
    with ServerThread(server.config.app) as base:
        deadline = time.monotonic() + 60
        while httpx.get(f"{base}/ready").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        with pytest.raises(ValueError, match="needs an API key"):
            run_benchmark(base, concurrency=[1], input_len=4, output_len=2, num_prompts=1, long_context=False)
        section = run_benchmark(base, concurrency=[1], input_len=4, output_len=2, num_prompts=1,
                                long_context=False, api_key="s3cret")
        assert section["runs"][0]["failed"] == 0 and section["runs"][0]["output_tok_s"] > 0
