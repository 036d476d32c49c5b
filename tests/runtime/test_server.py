"""The OpenAI-compatible server over real HTTP (uvicorn on a free port) on the tiny native Llama."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest

from agents.runtime.engine import LLMEngine
from agents.runtime.server import create_app
from agents.runtime.server.launcher import ServerThread
from agents.runtime.testing.make_model import cached_model


def _wait(predicate, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


@pytest.fixture(scope="module")
def engine():
    return LLMEngine(cached_model("llama"), num_blocks=256, max_pending=64)


@pytest.fixture(scope="module")
def url(engine):
    with ServerThread(create_app(engine, "tiny-llama")) as base:
        assert _wait(lambda: httpx.get(f"{base}/ready").status_code == 200)
        yield base


def _events(resp: httpx.Response) -> list:
    out = []
    for line in resp.iter_lines():
        if line.startswith("data: "):
            out.append(line[6:] if line[6:] == "[DONE]" else json.loads(line[6:]))
    return out


def test_ready_is_503_until_weights_load_and_warm_up():
    gate = threading.Event()

    def factory() -> LLMEngine:
        gate.wait(30)
        return LLMEngine(cached_model("llama"), num_blocks=32)

    with ServerThread(create_app(factory, "tiny-llama"), wait_ready=False) as base:
        assert httpx.get(f"{base}/health").status_code == 200
        r = httpx.get(f"{base}/ready")
        assert r.status_code == 503 and r.json()["status"] == "loading"
        r = httpx.post(f"{base}/v1/completions", json={"prompt": "hi"})
        assert r.status_code == 503 and "loading" in r.json()["error"]["message"]
        gate.set()
        assert _wait(lambda: httpx.get(f"{base}/ready").status_code == 200)
        app_runtime = httpx.get(f"{base}/v1/models").json()["data"][0]
        assert app_runtime["max_model_len"] == 512  # 32 blocks x 16


def test_completion_non_streaming(url):
    r = httpx.post(
        f"{url}/v1/completions",
        json={"model": "tiny-llama", "prompt": "Hello", "max_tokens": 7, "temperature": 0, "ignore_eos": True},
        timeout=30,
    )
    body = r.json()
    assert r.status_code == 200 and body["object"] == "text_completion"
    assert body["choices"][0]["finish_reason"] == "length"
    assert (
        body["usage"]["completion_tokens"] == 7 and body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + 7
    )


def test_completion_streaming_matches_non_streaming_and_ends_with_usage(url):
    req = {"prompt": "Hello", "max_tokens": 7, "temperature": 0, "ignore_eos": True}
    full = httpx.post(f"{url}/v1/completions", json=req, timeout=30).json()["choices"][0]["text"]
    stream_req = {**req, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{url}/v1/completions", json=stream_req, timeout=30) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        events = _events(resp)
    assert events[-1] == "[DONE]"
    usage_chunk = events[-2]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 7
    assert "".join(e["choices"][0]["text"] for e in events[:-2]) == full
    assert events[-3]["choices"][0]["finish_reason"] == "length"


def test_chat_completion_both_ways(url):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "Hi there"}]
    r = httpx.post(
        f"{url}/v1/chat/completions", json={"messages": messages, "max_tokens": 5, "temperature": 0}, timeout=30
    )
    body = r.json()
    assert r.status_code == 200 and body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["role"] == "assistant"
    with httpx.stream(
        "POST",
        f"{url}/v1/chat/completions",
        json={"messages": messages, "max_tokens": 5, "temperature": 0, "stream": True},
        timeout=30,
    ) as resp:
        events = _events(resp)
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(e["object"] == "chat.completion.chunk" for e in events[:-1])
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1])
    assert text == body["choices"][0]["message"]["content"]
    assert "usage" not in events[-2]  # no include_usage: no usage chunk


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {"prompt": "hi", "max_tokens": -3}, "max_tokens"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 10**6}, "max_tokens"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": "ten"}, "max_tokens"),
        ("/v1/completions", {"prompt": "word " * 1100}, "prompt"),
        ("/v1/completions", {"prompt": 5}, "prompt"),
        ("/v1/completions", {"prompt": "hi", "temperature": -1}, "temperature"),
        ("/v1/chat/completions", {"messages": "hello"}, "messages"),
        ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, "messages"),
        ("/v1/chat/completions", {"messages": [{"role": "user"}]}, "messages"),
    ],
)
def test_bad_requests_get_400_in_openai_error_shape(url, path, body, param):
    r = httpx.post(f"{url}{path}", json=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["message"] and err["param"] == param


def test_invalid_json_is_a_400(url):
    r = httpx.post(f"{url}/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]


def test_queue_full_is_429_and_the_server_keeps_serving(engine, url):
    old = engine.config.max_pending
    engine.config.max_pending = 1
    try:
        req = {"prompt": "Hello", "max_tokens": 1000, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=req, timeout=30) as resp:
            lines = resp.iter_lines()  # keep the iterator: dropping it closes the connection
            next(lines)
            r = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=30)
            assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_exceeded"
    finally:
        engine.config.max_pending = old
    assert _wait(lambda: engine.stats()["kv_blocks_used"] == 0)
    assert httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=30).status_code == 200


@pytest.mark.parametrize("stream", [True, False])
def test_client_disconnect_aborts_and_frees_blocks(engine, url, stream):
    req = {"prompt": "Hello " * 20, "max_tokens": 900, "ignore_eos": True, "stream": stream}
    if stream:
        with httpx.Client(timeout=30) as client, client.stream("POST", f"{url}/v1/completions", json=req) as resp:
            next(resp.iter_lines())
            assert engine.stats()["kv_blocks_used"] > 0
    else:  # a raw socket, closed as soon as the request runs: no timing assumption about the model's speed
        host, port = url.removeprefix("http://").split(":")
        body = json.dumps(req).encode()
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            assert _wait(lambda: engine.stats()["kv_blocks_used"] > 0)
    assert _wait(lambda: engine.stats()["kv_blocks_used"] == 0 and engine.stats()["num_running"] == 0)
    metrics = httpx.get(f"{url}/metrics").text
    assert 'vllm:request_success_total{finished_reason="abort",model_name="tiny-llama"}' in metrics


def test_models_health_and_metrics(url):
    card = httpx.get(f"{url}/v1/models").json()["data"][0]
    assert card["id"] == "tiny-llama" and card["max_model_len"] == 1024
    assert httpx.get(f"{url}/health").json() == {"status": "ok"}
    text = httpx.get(f"{url}/metrics").text
    for name in (
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:time_per_output_token_seconds_count",
        "day0:kv_blocks_used",
        "day0:kv_blocks_free",
        "vllm:num_requests_waiting",
        "vllm:generation_tokens_total",
        "day0:engine_step_seconds_bucket",
    ):
        assert name in text


def test_engine_step_histogram_counts_the_steps(engine, url):
    def steps() -> tuple[int, float]:
        lines = dict(line.rsplit(" ", 1) for line in httpx.get(f"{url}/metrics").text.splitlines()
                     if line.startswith("day0:engine_step_seconds_"))
        labels = '{model_name="tiny-llama"}'
        return (int(float(lines[f"day0:engine_step_seconds_count{labels}"])),
                float(lines[f"day0:engine_step_seconds_sum{labels}"]))

    before, seconds = steps()
    body = {"prompt": "count the steps", "max_tokens": 5, "temperature": 0, "ignore_eos": True}
    assert httpx.post(f"{url}/v1/completions", json=body, timeout=60).status_code == 200
    after, later = steps()
    assert after - before >= 5 and later > seconds  # one prefill and four decodes at least, each timed


def test_32_simultaneous_streams_equal_each_prompt_alone(engine, url):
    prompts = [f"Request number {i} says" + " more" * (i % 7) for i in range(32)]
    req = {"max_tokens": 12, "temperature": 0, "ignore_eos": True}
    alone = [
        httpx.post(f"{url}/v1/completions", json={**req, "prompt": p}, timeout=60).json()["choices"][0]["text"]
        for p in prompts
    ]
    results: list[str | None] = [None] * 32

    def run(i: int) -> None:
        with httpx.stream(
            "POST", f"{url}/v1/completions", json={**req, "prompt": prompts[i], "stream": True}, timeout=120
        ) as resp:
            results[i] = "".join(e["choices"][0]["text"] for e in _events(resp)[:-1])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == alone
    assert engine.stats()["kv_blocks_used"] == 0


def test_unknown_routes_and_methods_answer_in_openai_shape(url):
    r = httpx.get(f"{url}/v1/nothing")
    assert r.status_code == 404 and "/v1/nothing" in r.json()["error"]["message"]
    r = httpx.get(f"{url}/v1/completions")
    assert r.status_code == 405 and r.json()["error"]["code"] == 405
