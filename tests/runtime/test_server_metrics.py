"""``day0 serve``'s ``/metrics`` read as a vLLM server's: every metric the shipped runtime dashboard queries is
there after a few concurrent requests on the tiny model, counted per token and per request as vLLM counts them."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agents.runtime.engine import LLMEngine
from agents.runtime.server import create_app
from agents.runtime.server.launcher import ServerThread
from agents.runtime.testing.make_model import cached_model

DOCKER = Path(__file__).resolve().parents[2] / "docker"
DASHBOARD = DOCKER / "grafana/dashboards/day0-runtime.json"
RULES = DOCKER / "prometheus/rules/day0.yml"
MODEL = "tiny-llama"
# served only where they mean something: an MoE model's expert balance, and the ranks' time in collectives while
# the timer runs (``POST /stats/comm``); each has its own test below
CONDITIONAL = {"day0:expert_load_max_over_mean", "day0:comm_overhead_ratio"}


@pytest.fixture(scope="module")
def url():
    engine = LLMEngine(cached_model("llama"), num_blocks=128, max_pending=32)
    with ServerThread(create_app(engine, MODEL)) as base:
        yield base


def samples(url: str) -> dict[tuple[str, frozenset], float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(found: dict, name: str, **labels: str) -> float:
    return found.get((name, frozenset({"model_name": MODEL, **labels}.items())), 0.0)


async def _load(url: str, n: int, max_tokens: int) -> list[dict]:
    async with httpx.AsyncClient(timeout=120) as client:
        async def one(i: int) -> dict:
            body = {"prompt": f"Request {i} asks" + " more" * i, "max_tokens": max_tokens, "ignore_eos": True,
                    "temperature": 0, "stream": i % 2 == 0}
            if body["stream"]:
                body["stream_options"] = {"include_usage": True}
            resp = await client.post(f"{url}/v1/completions", json=body)
            assert resp.status_code == 200
            if not body["stream"]:
                return resp.json()["usage"]
            chunks = [json.loads(line[6:]) for line in resp.text.splitlines()
                      if line.startswith("data: {")]
            return next(c["usage"] for c in chunks if c.get("usage"))

        return await asyncio.gather(*(one(i) for i in range(n)))


def test_the_dashboards_metrics_are_served_under_load_and_count_per_token(url):
    before = samples(url)
    usages = asyncio.run(_load(url, 6, 8))
    assert httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": -1}).status_code == 400
    after = samples(url)

    def grew(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert grew("vllm:request_success_total", finished_reason="length") == 6
    assert grew("vllm:prompt_tokens_total") == sum(u["prompt_tokens"] for u in usages)
    assert grew("vllm:generation_tokens_total") == 6 * 8
    # one inter-token interval per token after the first: per token, not per request
    assert grew("vllm:inter_token_latency_seconds_count") == 6 * 7
    assert grew("vllm:time_per_output_token_seconds_count") == 6 * 7
    for per_request in ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds",
                        "vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds",
                        "vllm:request_decode_time_seconds", "vllm:request_time_per_output_token_seconds"):
        assert grew(f"{per_request}_count") == 6, per_request
    assert 0 <= value(after, "vllm:kv_cache_usage_perc") <= 1
    assert value(after, "vllm:num_requests_running") == 0 and value(after, "vllm:num_requests_waiting") == 0

    queried = set(re.findall(r"\b((?:vllm|day0):[a-z0-9_:]+)", DASHBOARD.read_text() + RULES.read_text()))
    assert {"vllm:num_requests_running", "vllm:kv_cache_usage_perc", "vllm:time_to_first_token_seconds_bucket",
            "vllm:inter_token_latency_seconds_bucket"} <= queried
    served = {name for name, _ in after}
    assert queried - CONDITIONAL <= served, sorted(queried - CONDITIONAL - served)


def test_refused_requests_are_counted_by_status(url):
    before = value(samples(url), "day0:request_errors_total", status="400")
    assert httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": -1}).status_code == 400
    assert value(samples(url), "day0:request_errors_total", status="400") == before + 1


def test_two_servers_in_one_process_count_apart(url):
    other = create_app(LLMEngine(cached_model("llama"), num_blocks=16), "another").state.runtime.metrics
    assert "another" in other.render() and MODEL not in other.render()


def test_native_decode_coverage_is_exported(url):
    httpx.post(f"{url}/v1/completions", json={"prompt": "cover", "max_tokens": 4, "ignore_eos": True}, timeout=60)
    found = samples(url)
    steps = value(found, "day0:decode_steps_total")
    assert steps >= 3
    assert value(found, "day0:native_decode_coverage_ratio") == value(found, "day0:native_decode_steps_total") / steps


def test_time_in_collectives_is_served_while_the_timer_runs(url):
    assert not any(name == "day0:comm_overhead_ratio" for name, _ in samples(url))
    assert httpx.post(f"{url}/stats/comm", json={"enabled": True}).status_code == 200
    try:
        httpx.post(f"{url}/v1/completions", json={"prompt": "time", "max_tokens": 3, "ignore_eos": True}, timeout=60)
        ratio = value(samples(url), "day0:comm_overhead_ratio", rank="0")
    finally:
        httpx.post(f"{url}/stats/comm", json={"enabled": False})
    assert ratio == 0.0  # one rank: steps timed, no collective


def test_expert_balance_of_an_moe_model():
    engine = LLMEngine(cached_model("qwen3-moe"), num_blocks=32)
    with ServerThread(create_app(engine, "tiny-moe")) as base:
        httpx.post(f"{base}/v1/completions", json={"prompt": "route me", "max_tokens": 4}, timeout=60)
        found = samples(base)
    counts = engine.expert_load.counts()
    worst = max(max(row) / (sum(row) / len(row)) for row in counts if sum(row))
    assert found[("day0:expert_load_max_over_mean", frozenset({"model_name": "tiny-moe", "layers": "worst"}.items()))] \
        == pytest.approx(worst)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian's prometheus package) not installed")
def test_promtool_accepts_the_exposition(url):
    asyncio.run(_load(url, 2, 3))
    text = httpx.get(f"{url}/metrics").text
    done = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    problems = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()
                and not line.endswith("metric names should not contain ':'")  # vLLM's own names have colons
                and not line.startswith("vllm:iteration_tokens_total non-counter")]  # vLLM's name, kept as is
    assert done.returncode in (0, 3) and not problems, problems  # 3: lint findings only, all of them the above
