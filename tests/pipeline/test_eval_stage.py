"""The eval stage: task quality of the target within tolerance of the transformers reference."""

from __future__ import annotations

import torch

from agents.pipeline.runner import run_pipeline


def test_eval_passes_for_a_faithful_target_and_reports_both_sides(make_ctx) -> None:
    ctx, _ = make_ctx("qwen3")
    report = run_pipeline(ctx, ["load", "eval"])
    section = report["stages"]["eval"]
    assert report["failed_stage"] is None and section["passed"] is True
    task = section["tasks"][0]
    assert task["items"] == 16 and task["agreement"] == 1.0 and task["accuracy_ref"] == task["accuracy_target"]
    assert abs(section["perplexity_target"] - section["perplexity_ref"]) / section["perplexity_ref"] < 1e-5


def test_eval_fails_when_the_target_drifts_from_the_reference(make_ctx) -> None:
    ctx, _ = make_ctx("qwen3")
    run_pipeline(ctx, ["load"])
    model = ctx.shared["model"]
    name, param = next((n, p) for n, p in model.named_parameters() if "layers.0." in n and "down_proj" in n)
    with torch.no_grad():
        param.mul_(40.0)
    report = run_pipeline(ctx, ["eval"])
    assert report["failed_stage"] == "eval", name
    assert report["error"].startswith("outside tolerance")
    assert report["stages"]["eval"]["passed"] is False
