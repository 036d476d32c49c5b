"""The load and serve stages at TP>1 on the tiny Llama: real gloo ranks (spawned processes), a real ``day0 serve
--tp 2`` subprocess, real HTTP."""

from __future__ import annotations

import shutil

import httpx
import pytest
import torch
from safetensors.torch import load_file, save_file

from agents.pipeline.stages import load, serve
from agents.pipeline.support import layout
from agents.pipeline.support.errors import StageFailed
from agents.pipeline.support.server import stop_server
from agents.runtime.testing.make_model import cached_model


def test_sharded_load_merges_the_ranks_and_matches_the_tp1_totals(make_ctx):
    ctx1, _ = make_ctx("llama")
    single = load.run(ctx1)
    ctx2, log = make_ctx("llama", tp=2)
    sharded = load.run(ctx2)

    assert single["tp"] == 1 and "ranks" not in single and ctx1.state.model is not None
    assert sharded["ok"] and sharded["tp"] == 2 and ctx2.state.model is None
    for key in ("tensors", "bytes", "path", "architecture", "dtype"):
        assert sharded[key] == single[key], key
    assert [s["sha256"] for s in sharded["shards"]] == [s["sha256"] for s in single["shards"]]
    assert sharded["stats"].keys() == single["stats"].keys()  # rank 0 reads every tensor whole
    assert [r["rank"] for r in sharded["ranks"]] == [0, 1]
    rank_bytes = [r["bytes"] for r in sharded["ranks"]]
    # each rank holds about half: its slices plus the small replicated norms
    assert all(b < 0.6 * single["bytes"] for b in rank_bytes) and sum(rank_bytes) >= single["bytes"]
    assert all(r["seconds"] > 0 and r["peak_rss_bytes"] > 0 for r in sharded["ranks"])
    assert sharded["peak_rss_bytes"] == max(r["peak_rss_bytes"] for r in sharded["ranks"])
    assert any("tp=2" in e["message"] for e in log.events if e["kind"] == "log")
    progress = [e["data"] for e in log.events if e["kind"] == "progress"]
    assert progress and progress[-1]["done"] == progress[-1]["total"] == single["tensors"]
    copy = sharded["tp1_copy"]
    assert copy["fits"] and copy["bytes"] == sum(rank_bytes) and copy["available_bytes"] > copy["bytes"]
    assert "tp=1 copy" in sharded["notes"][0]


def test_a_corrupted_shard_fails_the_tp2_load_naming_rank_file_and_tensor(make_ctx, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(cached_model("llama"), broken)
    shard = sorted(broken.glob("model-*.safetensors"))[0]
    tensors = load_file(shard)
    name = sorted(tensors)[0]
    tensors[name] = torch.zeros(3, 5)  # a header that no longer matches the model's declared shape
    save_file(tensors, shard, metadata={"format": "pt"})
    ctx, _ = make_ctx(broken, tp=2)
    with pytest.raises(StageFailed) as exc:
        load.run(ctx)
    message = str(exc.value)
    assert message.startswith("rank 0 of 2") and "(also ranks [1])" in message
    assert shard.name in message and name in message


def test_effective_tp_comes_from_the_override_else_the_plan_clipped_to_this_host(make_ctx, monkeypatch):
    ctx, _ = make_ctx("llama", tp=3)
    assert layout.effective_tp(ctx) == (3, None)
    ctx, _ = make_ctx("llama", tp=layout.MAX_CPU_TP + 1)
    with pytest.raises(StageFailed, match="more ranks than this host runs"):
        layout.effective_tp(ctx)
    ctx, _ = make_ctx("llama", results={"plan": {"plan": {"tp": 4}}})
    tp, note = layout.effective_tp(ctx)
    assert tp == 1 and "tp=4" in note  # CPU: the plan's degree is not used unless pinned
    # no GPU here: the CUDA device count is the one thing stood in for
    monkeypatch.setattr(layout, "_cuda_devices", lambda: 2)
    ctx, _ = make_ctx("llama", device="cuda", results={"plan": {"plan": {"tp": 4}}})
    assert layout.effective_tp(ctx) == (2, "the plan's tp=4 clipped to the 2 CUDA device(s) of this host")
    ctx, _ = make_ctx("llama", device="cuda", tp=4)
    with pytest.raises(StageFailed, match="2 CUDA device"):
        layout.effective_tp(ctx)


def _greedy(url: str) -> list[str]:
    texts = []
    for prompt in ("The capital of France is", "Once upon a time", "1 2 3 4"):
        body = {"prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
        r = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        texts.append(r.json()["choices"][0]["text"])
    return texts


@pytest.mark.slow
def test_serve_at_tp2_answers_the_text_path_with_tp1_greedy_output(make_ctx, tmp_path):
    outputs = {}
    for tp in (2, 1):
        ctx, _ = make_ctx("llama", tp=tp, workdir=tmp_path / f"tp{tp}")
        try:
            section = serve.run(ctx)
            assert section["text_path_ok"], section
            assert section["tp"] == tp
            outputs[tp] = _greedy(section["endpoint"])
        finally:
            stop_server(ctx)
    assert "rank1" in (tmp_path / "tp2" / "serve.log").read_text()  # two ranks served
    assert all(outputs[2]) and outputs[2] == outputs[1]


@pytest.mark.slow
def test_adapt_with_tp2_reports_tp2_in_plan_load_and_serve(tmp_path):
    """``day0 adapt --tp 2`` end to end (about 25 s here: two spawned loads and a served bench)."""
    import json
    import os
    import subprocess
    import sys

    report = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "day0cli", "adapt", str(cached_model("llama")), "--hardware", "cpu",
           "--tp", "2", "--stages", "plan,load,serve,bench", "--workdir", str(tmp_path), "--report", str(report)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    stages = json.loads(report.read_text())["stages"]
    assert stages["plan"]["plan"]["tp"] == stages["load"]["tp"] == stages["serve"]["tp"] == 2
    assert len(stages["load"]["ranks"]) == 2 and stages["serve"]["text_path_ok"]
    assert any(run["output_tok_s"] > 0 for run in stages["bench"]["runs"])
    assert json.loads(report.read_text())["tier"] >= 3


@pytest.mark.slow
def test_a_manifest_mismatch_fails_the_tp2_load_once_naming_the_shard(make_ctx, tmp_path):
    """Rank 0 hashes every shard and checks the manifest; the other ranks read only their slices."""
    import shutil

    from agents.pipeline.runner import run_pipeline
    from agents.runtime.loader.manifest import build_manifest
    from agents.runtime.testing.make_model import cached_model

    model = tmp_path / "model"
    shutil.copytree(cached_model("llama"), model)
    manifest = build_manifest(model, use_cache=False)
    manifest[0] = {**manifest[0], "sha256": "f" * 64}
    ctx, _ = make_ctx(model, tp=2, manifest=manifest)
    report = run_pipeline(ctx, ["load"])
    assert report["failed_stage"] == "load"
    problems = report["stages"]["load"]["problems"]
    assert [p["file"] for p in problems] == [manifest[0]["name"]] and problems[0]["rank"] == 0
    assert "f" * 64 in report["error"]
