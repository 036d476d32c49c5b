"""run_pipeline: stage order, events, stopping at the first failure, cancellation, a stage nobody registered."""

from __future__ import annotations

import pytest

from agents.pipeline.runner import parse_stages, run_pipeline


def test_stages_run_in_design_order_and_emit_started_and_finished(make_ctx) -> None:
    ctx, log = make_ctx("llama")
    report = run_pipeline(ctx, ["env", "plan"])
    assert report["stages_requested"] == ["plan", "env"]
    assert log.kinds("stage_started", "stage_finished") == [
        ("stage_started", "plan"), ("stage_finished", "plan"), ("stage_started", "env"), ("stage_finished", "env")]
    assert report["failed_stage"] is None and report["error"] is None
    assert report["tier"] == 1 and report["tier_name"] == "planned"
    assert report["model"] == {"name": ctx.model_dir.name, "architecture": "LlamaForCausalLM", "path": "native"}
    assert report["hardware"] == "cpu" and report["dtype"] == "float32"


def test_unknown_stage_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="unknown stage.*'aling'"):
        parse_stages("plan,aling")
    with pytest.raises(ValueError, match="no stages"):
        parse_stages(" , ")


def test_a_plan_that_does_not_fit_stops_the_pipeline_at_plan(make_ctx) -> None:
    ctx, log = make_ctx("llama", hardware={"slug": "pocket", "memory_bytes": 10_000, "devices_per_node": 1})
    report = run_pipeline(ctx, ["plan", "load", "align"])
    assert report["failed_stage"] == "plan" and report["tier"] == 0
    assert report["error"] and "fit" in report["error"]
    assert report["stages"]["plan"]["fits"] is False  # the evidence is kept
    assert "load" not in report["stages"] and ("stage_started", "load") not in log.kinds("stage_started")


def test_every_stage_of_the_pipeline_order_is_registered() -> None:
    from agents.pipeline.registry import STAGES
    from contract.tiers import STAGE_ORDER

    assert set(STAGES) == set(STAGE_ORDER) and all(callable(run) for run in STAGES.values())


def test_an_unregistered_stage_is_a_clear_failure(make_ctx, monkeypatch) -> None:
    from agents.pipeline.registry import STAGES

    monkeypatch.delitem(STAGES, "bench")  # as if no bench stage were installed
    ctx, _ = make_ctx("llama")
    report = run_pipeline(ctx, ["plan", "bench"])
    assert report["failed_stage"] == "bench"
    assert report["error"] == "stage 'bench' is not available: no stage is registered under that name"
    assert report["tier"] == 1


def test_cancellation_ends_with_the_interrupted_stage_and_cancelled(make_ctx) -> None:
    ctx, log = make_ctx("llama")
    ctx.cancel_event.set()
    report = run_pipeline(ctx, ["plan", "load"])
    assert (report["failed_stage"], report["error"]) == ("plan", "cancelled")
    finished = [e for e in log.events if e["kind"] == "stage_finished"]
    assert finished[0]["data"]["passed"] is False and finished[0]["level"] == "warning"


def test_a_stage_that_raises_names_the_problem(make_ctx) -> None:
    ctx, _ = make_ctx("llama", model_dir=None)  # config only: nothing to load
    report = run_pipeline(ctx, ["plan", "load"])
    assert report["failed_stage"] == "load" and "no model directory" in report["error"]
    assert report["tier"] == 1


def test_load_leaves_the_model_for_later_stages_and_reports_progress(make_ctx) -> None:
    ctx, log = make_ctx("qwen3")
    report = run_pipeline(ctx, ["load"])
    assert report["stages"]["load"]["ok"] is True and report["failed_stage"] is None
    assert ctx.state.model.path == report["model"]["path"]
    progress = [e["data"] for e in log.events if e["kind"] == "progress"]
    assert progress and progress[-1]["done"] == progress[-1]["total"] == report["stages"]["load"]["tensors"]


def test_thresholds_are_checked_by_name_and_type() -> None:
    from agents.pipeline.runner import check_thresholds

    assert check_thresholds({"layer_cosine": "0.995", "kv_cache_max_abs_err": 1e-3}) == {
        "layer_cosine": 0.995, "kv_cache_max_abs_err": 1e-3}
    with pytest.raises(ValueError, match="'layer_cosin' is not read by any stage"):
        check_thresholds({"layer_cosin": 0.9})
    with pytest.raises(ValueError, match="op_cosine: None is not a number"):
        check_thresholds({"op_cosine": None})


def test_the_report_claims_what_the_verdicts_judge_not_the_stages_own_flags(make_ctx, monkeypatch) -> None:
    """A load section that says ok while naming a problem is judged by its numbers: failed, tier stays 1."""
    from agents.pipeline.registry import STAGES
    from agents.pipeline.stages import load as real_load

    def lenient(ctx):
        section = real_load.run(ctx)
        section["problems"] = [{"tensor": "model.norm.weight", "problem": "3 NaN values"}]  # ok stays True
        return section

    monkeypatch.setitem(STAGES, "load", lenient)
    ctx, _ = make_ctx("llama")
    report = run_pipeline(ctx, ["plan", "load"])
    assert report["stages"]["load"]["ok"] is True  # the claim is kept as written
    assert report["verdicts"]["plan"]["status"] == "pass" and report["verdicts"]["load"]["status"] == "fail"
    assert report["failed_stage"] == "load" and report["tier"] == 1
    assert "model.norm.weight: 3 NaN values" in report["error"]
