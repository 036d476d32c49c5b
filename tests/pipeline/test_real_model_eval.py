"""The eval stage on the real model (SmolLM2-135M-Instruct): the target through a real ``day0 serve`` over
HTTP, the reference transformers fp32 on the same weights. It passes on a faithful target and fails, naming
the task that dropped, when the served target is degraded on purpose (a wrong rope theta, perturbed weights)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from agents.pipeline.runner import run_pipeline
from agents.pipeline.support.server_process import ServerProcess
from tests.real_model_fixtures import smollm2  # noqa: F401 - the session fixture

SMALL = {"eval_limit": 4, "eval_needle_lengths": [160], "eval_needle_depths": [0, 100]}


def _serve(ctx: Any, model_dir: Path, tmp_path: Path) -> None:
    """A real server on ``model_dir`` handed to the eval stage as the serve stage would (the stage stops it)."""
    server = ServerProcess(model_dir, dtype="float32", device="cpu", tp=None, log_path=tmp_path / "serve.log")
    ctx.state.server = server
    server.wait_ready(300)


def _copy_with(model_dir: Path, out: Path, config: dict[str, Any] | None = None) -> Path:
    """``model_dir`` as links, except a rewritten config.json."""
    out.mkdir()
    for path in model_dir.iterdir():
        if path.name != "config.json":
            (out / path.name).symlink_to(path)
    (out / "config.json").write_text(json.dumps(config or json.loads((model_dir / "config.json").read_text())))
    return out


@pytest.mark.slow
def test_eval_on_the_real_model_passes_with_both_sides_on_every_task(make_ctx, smollm2, tmp_path) -> None:  # noqa: F811
    ctx, log = make_ctx(smollm2, bench=SMALL, workdir=tmp_path)
    torch.set_num_threads(2)
    _serve(ctx, smollm2, tmp_path)
    report = run_pipeline(ctx, ["eval"])
    section = report["stages"]["eval"]
    assert report["failed_stage"] is None, report["error"]
    assert section["passed"] is True and section["endpoint"].startswith("http://127.0.0.1:")
    rows = {row["task"]: row for row in section["tasks"]}
    assert set(rows) == {"day0_mc", "day0_qa", "day0_ppl", "needle"}
    assert rows["day0_mc"]["n"] == 4 and rows["day0_mc"]["agreement"] == 1.0
    assert rows["day0_mc"]["loglik_max_abs_diff"] < 1e-2  # fp32 both sides: the same log-likelihoods
    assert rows["day0_qa"]["target"] > 0.5 and rows["day0_qa"]["examples"][0]["target"] == "Paris"
    assert rows["day0_ppl"]["target"] == pytest.approx(rows["day0_ppl"]["reference"], rel=1e-3)
    assert 5 < rows["day0_ppl"]["token_perplexity_reference"] < 60
    assert section["needle"]["lengths"] == [160] and section["needle"]["depths"] == [0, 100]
    assert section["needle"]["target"] == section["needle"]["reference"]
    assert all(0 <= row["wilson_low"] <= row["target"] for row in section["tasks"] if row["wilson_low"] is not None)
    assert ctx.state.server is None  # the eval stage was the server's last user
    progress = [e["message"] for e in log.events if e["kind"] == "progress"]
    assert any(m.startswith("eval day0_mc target") for m in progress)
    assert any(m.startswith("eval needle reference") for m in progress)


@pytest.mark.slow
def test_eval_fails_naming_the_task_when_the_served_target_has_a_wrong_rope_theta(
        make_ctx, smollm2, tmp_path) -> None:  # noqa: F811
    config = json.loads((smollm2 / "config.json").read_text())
    config["rope_parameters"] = {**config["rope_parameters"], "rope_theta": 10000.0}  # Llama-2's, not SmolLM2's
    degraded = _copy_with(smollm2, tmp_path / "wrong-rope", config)
    ctx, _ = make_ctx(smollm2, bench={"eval_tasks": ["day0_ppl"], "eval_limit": 4}, workdir=tmp_path)
    torch.set_num_threads(2)
    _serve(ctx, degraded, tmp_path)
    report = run_pipeline(ctx, ["eval"])
    assert report["failed_stage"] == "eval"
    assert "task day0_ppl word_perplexity" in report["error"]  # the portal's verdict names the task
    assert "task day0_ppl dropped: word_perplexity" in report["stages"]["eval"]["summary"]  # and the stage's claim
    row = report["stages"]["eval"]["tasks"][0]
    assert row["passed"] is False and row["target"] > row["reference"] * 1.05
    assert report["tier"] < 6


@pytest.mark.slow
def test_eval_fails_naming_the_tasks_when_the_served_weights_are_perturbed(make_ctx, smollm2, tmp_path) -> None:  # noqa: F811
    from safetensors.torch import load_file, save_file

    degraded = tmp_path / "perturbed"
    degraded.mkdir()
    index = json.loads((smollm2 / "model.safetensors.index.json").read_text())
    names = sorted(n for n in index["weight_map"] if ".mlp.down_proj." in n)
    for path in smollm2.iterdir():
        if not path.name.endswith(".safetensors"):
            (degraded / path.name).symlink_to(path)
            continue
        tensors = load_file(path)
        gen = torch.Generator().manual_seed(0)
        for name in names:
            if name in tensors:  # every layer's down projection, 30 % multiplicative noise
                tensors[name] = tensors[name] * (1 + 0.3 * torch.randn(tensors[name].shape, generator=gen))
        save_file(tensors, degraded / path.name, metadata={"format": "pt"})
    ctx, _ = make_ctx(smollm2, bench={"eval_limit": 48, "eval_needle_lengths": [256, 512]}, workdir=tmp_path)
    torch.set_num_threads(2)
    _serve(ctx, degraded, tmp_path)
    report = run_pipeline(ctx, ["eval"])
    assert report["failed_stage"] == "eval"
    failed = [row["task"] for row in report["stages"]["eval"]["tasks"] if not row["passed"]]
    summary = report["stages"]["eval"]["summary"]
    assert "day0_ppl" in failed and all(f"task {task} " in report["error"] for task in failed)
    assert all(f"task {task} dropped" in summary for task in failed)


@pytest.mark.slow
def test_full_eval_on_the_real_model_is_above_chance_on_both_sides(make_ctx, smollm2, tmp_path) -> None:  # noqa: F811
    ctx, _ = make_ctx(smollm2, workdir=tmp_path)
    torch.set_num_threads(2)
    _serve(ctx, smollm2, tmp_path)
    report = run_pipeline(ctx, ["eval"])
    assert report["failed_stage"] is None, report["error"]
    rows = {row["task"]: row for row in report["stages"]["eval"]["tasks"]}
    assert rows["day0_mc"]["n"] >= 200
    for name in ("day0_mc", "day0_qa", "needle"):
        for side in ("reference", "target"):
            assert rows[name][side] > rows[name]["chance"] + 0.1, (name, side, rows[name])
    assert rows["day0_mc"]["wilson_low"] > 0.25
    assert report["stages"]["eval"]["needle"]["lengths"] == [256, 512, 1024]
