"""The serve, bench and KV-cache stages on the tiny Llama: a real ``day0 serve`` subprocess, real HTTP."""

from __future__ import annotations

import json
import shutil

import httpx
import pytest

from agents.pipeline.stages import bench, serve
from agents.pipeline.stages.align import kv as align_kv
from agents.pipeline.support.context import StageContext
from agents.pipeline.support.endpoints import chat_template_source
from agents.pipeline.support.errors import StageFailed
from agents.pipeline.support.server import stop_server
from agents.runtime.testing.make_model import cached_model


def _ctx(model_dir, tmp_path, **kw) -> StageContext:
    config = json.loads((model_dir / "config.json").read_text())
    return StageContext(
        model_dir=model_dir,
        config=config,
        hardware={"slug": "cpu"},
        workdir=tmp_path,
        emit_fn=lambda *a, **k: None,
        **kw,
    )


def test_serve_then_bench_then_stop(tmp_path):
    ctx = _ctx(
        cached_model("llama"),
        tmp_path,
        bench={"concurrency": [1, 2], "input_len": 16, "output_len": 8, "num_prompts": 4, "long_input_len": 96,
               "min_seconds": 0.3},
    )
    try:
        section = serve.run(ctx)
        assert section["text_path_ok"], section
        assert {c["name"] for c in section["checks"]} == {"completions", "completions_stream", "chat_completions"}
        assert section["ready_seconds"] > 0 and section["endpoint"].startswith("http://127.0.0.1:")
        assert section["chat_path_ok"] is True and section["chat_template"] == "tokenizer_config.json"
        proc = ctx.state.server.proc
        result = bench.run(ctx)
    finally:
        stop_server(ctx)
    assert proc.poll() is not None  # the server is gone after the bench
    assert [r["concurrency"] for r in result["runs"]] == [1, 2]
    assert result["requested"] == {"concurrency": [1, 2], "num_prompts": 4, "input_len": 16, "output_len": 8,
                                   "ignore_eos": True, "min_seconds": 0.3, "request_rate": None}
    for run in result["runs"]:
        # each level ran on with fresh prompts to its 0.3 s: at least the 4 asked, every one of them counted
        assert run["failed"] == 0 and run["completed"] == run["prompts"] >= 4 and run["duration_s"] >= 0.3
        assert run["output_tokens"] == 8 * run["completed"] and run["samples"]["e2e_ms"] == run["completed"]
        assert run["output_tok_s"] > 0 and run["ttft_ms"]["p50"] > 0 and run["tpot_ms"]["p99"] is not None
        assert set(run["itl_ms"]) == {"mean", "p50", "p90", "p99"}
    probe = result["probe"]
    assert probe["concurrency"] == 2 and probe["fresh"]["completed"] >= 4 and probe["repeated"]["completed"] >= 4
    assert probe["fresh"]["output_tok_s"] > 0 and probe["repeated"]["output_tok_s"] > 0
    assert result["long_context"]["input_len"] == 96 and result["long_context"]["failed"] == 0
    assert result["peak_memory_bytes"] > 0
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{section['endpoint']}/health", timeout=2)


def test_a_transformers_5_chat_template_jinja_is_served_and_checked(tmp_path):
    """transformers 5 saves the template as chat_template.jinja beside a tokenizer_config.json without one."""
    model = tmp_path / "model"
    shutil.copytree(cached_model("llama"), model)
    tok_cfg = json.loads((model / "tokenizer_config.json").read_text())
    (model / "chat_template.jinja").write_text(tok_cfg.pop("chat_template"))
    (model / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    ctx = _ctx(model, tmp_path)
    try:
        section = serve.run(ctx)
    finally:
        stop_server(ctx)
    assert section["chat_template"] == "chat_template.jinja" and section["chat_path_ok"] is True, section
    chat = next(c for c in section["checks"] if c["name"] == "chat_completions")
    assert chat["ok"] and section["text_path_ok"]


def test_a_model_without_a_chat_template_reports_no_chat_path(tmp_path):
    model = tmp_path / "model"
    shutil.copytree(cached_model("llama"), model)
    tok_cfg = json.loads((model / "tokenizer_config.json").read_text())
    tok_cfg.pop("chat_template")
    (model / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    assert chat_template_source(model) is None
    (model / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    assert chat_template_source(model) == "chat_template.jinja"


def test_serve_fails_with_the_server_log_when_weights_are_broken(tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(cached_model("llama"), broken)
    for shard in broken.glob("*.safetensors"):
        shard.write_bytes(b"not a safetensors file")
    ctx = _ctx(broken, tmp_path)
    with pytest.raises(StageFailed, match="exited with code"):
        serve.run(ctx)
    assert ctx.state.server is None


def test_kv_cache_check_passes_and_reuses_blocks(tmp_path):
    ctx = _ctx(cached_model("llama"), tmp_path, thresholds={"kv_cache_max_len": 200})
    section = align_kv.run(ctx)
    assert section["passed"] and section["lengths"] == [12, 50, 200]
    assert 0 <= section["max_abs_err"] <= 1e-4
    assert section["blocks_reused"] and section["blocks_freed"]
