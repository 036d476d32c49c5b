"""The eval stage's humaneval and agent_kv tasks end to end on a tiny random model served by the runtime:
pass@1 and success near 0 on both sides, the machinery runs and the report keys exist."""

from __future__ import annotations

import pytest
import torch

from agents.pipeline.runner import run_pipeline
from agents.pipeline.support.server_process import ServerProcess
from agents.runtime.testing.make_model import cached_model

BENCH = {"eval_tasks": ["humaneval", "agent_kv"], "eval_code_limit": 2, "eval_code_max_tokens": 24,
         "eval_agent_episodes": 2}


def test_code_and_agent_tasks_run_on_both_sides_and_report_their_keys(make_ctx, tmp_path) -> None:
    model = cached_model("llama")
    ctx, log = make_ctx(model, bench=BENCH, workdir=tmp_path)
    torch.set_num_threads(1)
    server = ServerProcess(model, dtype="float32", device="cpu", tp=None, log_path=tmp_path / "serve.log")
    ctx.state.server = server
    server.wait_ready(120)
    report = run_pipeline(ctx, ["eval"])
    section = report["stages"]["eval"]
    code, agent = section["code"], section["agent"]
    assert code["task"] == "humaneval" and code["n"] + len(code["skipped_for_context"]) == 2
    assert set(code["pass_at_1"]) == {"reference", "target"}
    assert code["pass_at_1"]["target"] <= 0.5 and code["pass_at_1"]["reference"] <= 0.5  # a random model
    assert all(row["target_status"] in ("passed", "failed", "timeout", "killed") for row in code["per_item"])
    assert all(len(row["target_sha256"]) == 64 for row in code["per_item"])
    assert agent["episodes"] == 2 and set(agent["success"]) == {"reference", "target"}
    assert 0.0 <= agent["turn_agreement"] <= 1.0 and len(agent["per_episode"]) == 2
    assert all(row["turns"]["reference"] >= 1 for row in agent["per_episode"])
    assert section["passed"] == (code["passed"] and agent["passed"])
    verdict = report["verdicts"]["eval"]
    assert verdict is not None
    progress = [e["message"] for e in log.events if e["kind"] == "progress"]
    assert any(m.startswith("eval humaneval target") for m in progress)
    assert any(m.startswith("eval agent_kv reference turn 1") for m in progress)
    assert ctx.state.server is None


@pytest.mark.parametrize(("bench", "match"), [({"eval_code_limit": 0}, "eval_code_limit"),
                                                ({"eval_agent_episodes": "4"}, "eval_agent_episodes")])
def test_acting_options_name_what_is_wrong(make_ctx, bench, match) -> None:
    from agents.pipeline.stages.eval.stage import options
    from agents.pipeline.support.errors import StageFailed

    ctx, _ = make_ctx(cached_model("llama"))
    ctx.bench = bench
    with pytest.raises(StageFailed, match=match):
        options(ctx, 1024)


def test_the_acting_tasks_run_only_when_named(make_ctx) -> None:
    from agents.pipeline.stages.eval.stage import options

    ctx, _ = make_ctx(cached_model("llama"))
    ctx.bench = {}
    assert options(ctx, 1024)["tasks"] == ["day0_mc", "day0_qa", "day0_ppl", "needle"]
    ctx.bench = {"eval_tasks": "agent_kv,humaneval", "eval_limit": 3}
    opts = options(ctx, 1024)
    assert opts["tasks"] == ["humaneval", "agent_kv"] and opts["code_limit"] == 3 and opts["agent_episodes"] == 3
