"""The compiled path through the pipeline: a job's ``bench.compile`` (validated by the jobs API), the serve stage's
compile evidence, the bench stage's compiled-against-eager run and align's compiled-against-eager tokens."""

from __future__ import annotations

import pytest
from rest_framework import serializers

from apps.jobs.api.serializers import JobCreateSerializer


@pytest.mark.parametrize("value", ["yes", 1, None, [True]])
def test_a_job_compile_setting_that_is_not_a_boolean_is_a_400_naming_it(value):
    with pytest.raises(serializers.ValidationError) as err:
        JobCreateSerializer().validate_bench({"compile": value})
    assert "compile" in err.value.detail and "true or false" in str(err.value.detail["compile"][0])


def test_a_job_may_ask_for_the_compiled_path():
    assert JobCreateSerializer().validate_bench({"compile": True, "concurrency": [1]})["compile"] is True


def _ctx(tmp_path, arch: str = "llama", **bench):
    import json

    from agents.pipeline.support.context import StageContext
    from agents.runtime.testing.make_model import cached_model

    model_dir = cached_model(arch)
    return StageContext(model_dir=model_dir, config=json.loads((model_dir / "config.json").read_text()),
                        hardware={"slug": "cpu"}, workdir=tmp_path, emit_fn=lambda *a, **k: None,
                        bench={"compile": True, **bench})


def test_compiled_and_eager_tokens_are_compared_position_by_position():
    from agents.pipeline.stages.align.compiled import compare

    same = [[(5, {5, 6}), (7, {7, 8})]]
    assert compare(same, same) == {"tokens": 2, "token_match_rate": 1.0, "equal": True, "first_divergence": [None],
                                   "divergences": [], "passed": True, "rows": [
                                       {"prompt": 0, "eager": [5, 7], "compiled": [5, 7], "eager_top": None,
                                        "compiled_top": None}]}
    near = compare([[(5, {5, 6}), (7, {7, 8})]], [[(5, {5, 6}), (8, {8, 7})]])
    assert near["first_divergence"] == [1] and near["divergences"][0]["near_tie"] and near["passed"]
    hard = compare([[(5, {5, 6})]], [[(9, {9, 1})]])
    assert not hard["equal"] and not hard["passed"]


def test_a_fallback_model_records_why_it_was_not_compiled(tmp_path):
    from agents.pipeline.stages.align import compiled as align_compiled
    from agents.pipeline.support import compiled

    ctx = _ctx(tmp_path)
    ctx.config = {**ctx.config, "architectures": ["NoSuchForCausalLM"]}
    assert compiled.serve_args(ctx) == []
    block = align_compiled.run(ctx)
    assert block["enabled"] is False and "fallback" in block["reason"] and block["passed"]


@pytest.mark.slow
def test_align_then_serve_and_bench_carry_compile_evidence(tmp_path, monkeypatch):
    """Align compiles in this process (the cache fills), the compiled server then starts from the cache, and the
    bench compares it with an eager server at one level."""
    from agents.pipeline.stages import bench, serve
    from agents.pipeline.stages.align import compiled as align_compiled
    from agents.pipeline.support.server import stop_server

    monkeypatch.setenv("DAY0_COMPILE_CACHE_DIR", str(tmp_path / "cache"))
    ctx = _ctx(tmp_path, concurrency=[1], num_prompts=2, output_len=8, long_context=False)
    block = align_compiled.run(ctx)
    assert block["enabled"] and block["equal"] and block["passed"], block
    assert block["graph_breaks"] == 0 and block["cache"]["fxgraph_miss"] >= 1
    try:
        section = serve.run(ctx)
        evidence = section["compile"]
        assert evidence["enabled"] and evidence["graph_breaks"] == 0 and evidence["recompiles_after_warmup"] == 0
        assert evidence["cache"]["fxgraph_hit"] >= 1 and evidence["cache"]["fxgraph_miss"] == 0, evidence["cache"]
        result = bench.run(ctx)
    finally:
        stop_server(ctx)
    comparison = result["compile"]
    assert comparison["concurrency"] == 1 and comparison["eager"]["output_tok_s"] > 0
    assert comparison["compiled"]["output_tok_s"] == result["runs"][0]["output_tok_s"]
    assert comparison["speedup_output_tok_s"] > 0 and "noisy" in comparison["note"]


def _align_with(block: dict):
    from contract import verdicts as v
    from tests.factories import TINY_LLAMA_CONFIG
    from tests.portal.reports import passing

    context = v.Context(model=v.ModelFacts(config=TINY_LLAMA_CONFIG, context_length=2048), dtype="float32")
    return v.judge("align", {**passing("align"), "compile": block}, None, context)


def test_the_portal_recomputes_compiled_against_eager_tokens():
    row = {"prompt": 0, "eager": [5, 7, 9], "compiled": [5, 7, 9], "eager_top": None, "compiled_top": None}
    assert _align_with({"enabled": True, "rows": [row], "passed": True}).status == "pass"
    differs = {**row, "compiled": [5, 8, 2], "eager_top": [7, 3], "compiled_top": [8, 1]}
    verdict = _align_with({"enabled": True, "rows": [differs], "passed": True})  # the claim is not trusted
    assert verdict.status == "fail" and "differ from eager ones at position 1" in verdict.reasons[0]
    near = {**differs, "eager_top": [7, 8], "compiled_top": [8, 7]}
    assert _align_with({"enabled": True, "rows": [near]}).status == "pass"
    assert _align_with({"enabled": True}).status == "incomplete"
    assert _align_with({"enabled": False, "reason": "fallback"}).status == "pass"  # not asked of this model


def test_the_bench_compares_only_a_server_the_serve_stage_saw_compiled(tmp_path):
    from agents.pipeline.stages import bench

    ctx = _ctx(tmp_path)
    block = bench.compile_compare(ctx, {"runs": [{"concurrency": 1, "output_tok_s": 10.0}]}, {"concurrency": [1]})
    assert block["enabled"] is False and "no compile evidence" in block["reason"]
