"""The generic command engine: the bundled server started by its command line as an external engine
(``engine: openai-compatible``) through a job spec, serve and eval through its endpoint, inventory and align not
applicable; an engine that never becomes ready, or exits mid-job, fails the stage naming it and its log tail; no
process of the job outlives it."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from agents.pipeline.runner import run_pipeline
from agents.runtime.testing.make_model import cached_model
from agents.worker.job_context import build_context
from contract.hardware import get_hardware

REPO = Path(__file__).resolve().parents[2]
BUNDLED = f"{sys.executable} -m agents.runtime serve {{model_path}} --port {{port}} --dtype {{dtype}} --device cpu"


def _job_ctx(tmp_path: Path, command: str, events: list, **bench):
    model_dir = cached_model("llama")
    spec = {"job": 1, "model": {"slug": "tiny-llama", "path": str(model_dir)},
            "hardware": {**get_hardware("cpu").to_dict(), "slug": "cpu"}, "dtype": "float32",
            "engine": {"name": "openai-compatible", "version": "", "command": command},
            "bench": {"ready_timeout": 120, **bench}}
    ctx = build_context(1, spec, lambda kind, message, **kw: events.append((kind, message)))
    ctx.workdir = tmp_path
    return ctx


def _alive(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_bundled_server_by_command_reaches_aligned_through_the_endpoint(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)  # the command runs the checkout's runtime module
    ctx = _job_ctx(tmp_path, BUNDLED, [], eval_limit=2, eval_needle_lengths=[768],
                   eval_needle_depths=[0])
    report = run_pipeline(ctx, ["plan", "load", "inventory", "align", "serve", "eval"])
    assert report["failed_stage"] is None, report["error"]
    inventory = report["stages"]["inventory"]
    assert inventory["applicable"] is False and inventory["engine"] == "openai-compatible" and inventory["reason"]
    # align through the endpoint: e2e against the local reference and the KV self-consistency check
    align = report["stages"]["align"]
    assert align["method"] == "endpoint" and align["engine"] == "openai-compatible" and align["passed"] is True
    assert report["verdicts"]["align"]["status"] == "pass", report["verdicts"]["align"]
    assert align["e2e"]["token_match_rate"] == 1.0 and align["e2e"]["tokens"] > 0
    kv = {row["case"]: row for row in align["kv_self"]["rows"]}
    assert set(kv) == {"miss", "hit", "hit_vs_miss", "noop", "perturbed"}
    assert kv["noop"]["mean_kl"] == 0.0 and kv["miss"]["mean_kl"] < 1e-6 and kv["hit"]["mean_kl"] < 1e-6
    assert kv["perturbed"]["mean_kl"] > align["kv_self"]["perturbed_floor"]  # the check sees a changed prompt
    assert report["tier"] >= 4  # aligned: bench (tier 5) was not asked for
    serve = report["stages"]["serve"]
    assert serve["endpoint"] == align["endpoint"]  # one engine for the job: serve kept the one align started
    assert serve["text_path_ok"] is True and serve["chat_path_ok"] is True
    engine = serve["engine"]
    assert engine["name"] == "openai-compatible" and engine["command"][1:4] == ["-m", "agents.runtime", "serve"]
    assert engine["environment"]["OMP_NUM_THREADS"] == os.environ["OMP_NUM_THREADS"]  # the version lock's part
    assert report["stages"]["eval"]["endpoint"] == serve["endpoint"]
    assert ctx.state.server is None and not _alive(engine["pid"])  # nothing of the job outlives it


def test_engine_that_never_becomes_ready_fails_naming_it_and_its_log(tmp_path):
    command = f"{sys.executable} -c \"print('engine warming up', flush=True); import time; time.sleep(600)\" {{port}}"
    ctx = _job_ctx(tmp_path, command, [], ready_timeout=3)
    started = time.monotonic()
    report = run_pipeline(ctx, ["serve"])
    assert report["failed_stage"] == "serve" and time.monotonic() - started < 60
    assert "engine openai-compatible not ready after 3 s" in report["error"]
    assert "engine warming up" in report["error"]  # its log tail
    assert ctx.state.server is None


def test_engine_exiting_mid_job_fails_the_next_stage_and_leaves_no_process(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    ctx = _job_ctx(tmp_path, BUNDLED, [], eval_tasks=["day0_mc"], eval_limit=2)
    from agents.pipeline.stages import serve
    from agents.pipeline.support.server import stop_engine

    try:
        section = serve.run(ctx)
        assert section["text_path_ok"] is True
        server = ctx.state.server
        server.proc.kill()  # the engine dies between stages
        server.proc.wait(timeout=10)
        report = run_pipeline(ctx, ["eval"])
    finally:
        stop_engine(ctx)
    assert report["failed_stage"] == "eval"
    assert "engine openai-compatible exited with code" in report["error"]
    assert not _alive(server.pgid)


def test_children_of_the_engine_are_stopped_with_it(tmp_path):
    # the engine forks a child that would outlive a plain terminate() of its parent
    script = ("import subprocess, sys, time; "
              "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
              "print('child started', flush=True); time.sleep(600)")
    ctx = _job_ctx(tmp_path, f"{sys.executable} -c \"{script}\" {{port}}", [], ready_timeout=2)
    from agents.pipeline.support.server import start_server

    engine = start_server(ctx)
    deadline = time.monotonic() + 20
    while "child started" not in engine.log_tail() and time.monotonic() < deadline:
        time.sleep(0.1)
    report = run_pipeline(ctx, ["serve"])  # replaces it with a fresh one, which also fails to become ready
    assert report["failed_stage"] == "serve"
    assert not _alive(engine.pgid)


@pytest.mark.slow
def test_vllm_cpu_engine_serves_through_its_endpoint(tmp_path):
    vllm = REPO / "var" / "vllm-venv" / "bin" / "vllm"
    if not vllm.exists():
        pytest.skip("no vLLM-CPU in var/vllm-venv (benchmarks/serving_vllm.py installs it)")
    model_dir = cached_model("llama")
    spec = {"job": 2, "model": {"slug": "tiny-llama", "path": str(model_dir)},
            "hardware": {**get_hardware("cpu").to_dict(), "slug": "cpu"}, "dtype": "float32",
            "engine": {"name": "vllm", "version": "0.32.0", "executable": "vllm",
                       "command": f"{vllm} serve {{model_path}} --port {{port}} --dtype {{dtype}} "
                                  "--max-model-len 512"},
            "bench": {"ready_timeout": 600}}
    ctx = build_context(2, spec, lambda *a, **k: None)
    ctx.workdir = tmp_path
    report = run_pipeline(ctx, ["serve"])
    assert report["failed_stage"] is None, report["error"]
    assert report["stages"]["serve"]["engine"]["reported_version"]
