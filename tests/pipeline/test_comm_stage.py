"""The comm stage: the job's layout's collectives over its ranks, its options, its section in the contract's
keys, and the stage in a whole TP × PP job (the library itself: test_collectives.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.pipeline.runner import run_pipeline
from agents.pipeline.stages import comm
from agents.pipeline.support.collectives import bus_factor
from agents.pipeline.support.context import StageContext
from agents.pipeline.support.errors import StageFailed


@pytest.mark.slow
def test_the_stage_reports_the_tp_layouts_collectives_in_the_contracts_keys(tmp_path: Path) -> None:
    ctx = StageContext(model_dir=None, config={"architectures": ["LlamaForCausalLM"]},
                       hardware={"slug": "cpu", "dtypes": ["float32", "bfloat16"]}, tp=2, workdir=tmp_path,
                       bench={"comm_max_bytes": 4096, "comm_min_bytes": 1024, "comm_iters": 3, "comm_warmup": 0})
    report = run_pipeline(ctx, "comm")
    assert report["failed_stage"] is None, report["error"]
    section = report["stages"]["comm"]
    assert section["ranks"] == 2 and report["tier"] == 0  # gates no tier
    assert {(row["op"], row["dtype"]) for row in section["collectives"]} == {
        (op, dt) for op in ("all_reduce", "all_gather", "reduce_scatter", "broadcast") for dt in ("float32", "bfloat16")}
    for row in section["collectives"]:
        assert row["ok"] is True
        assert [s["bytes"] for s in row["sizes"]] == [1024, 4096]
        for size in row["sizes"]:
            assert size["busbw_gbps"] == pytest.approx(size["algbw_gbps"] * bus_factor(row["op"], 2))
            assert 0 < size["latency_us"]["p50"] <= size["latency_us"]["p99"] <= size["latency_us"]["max"]
    from apps.evidence.services import parse_stage_section

    parse_stage_section("comm", section)  # the portal accepts what the stage writes


def test_the_stage_rejects_bad_options_naming_them(tmp_path: Path) -> None:
    ctx = StageContext(model_dir=None, config={}, hardware={"dtypes": ["float32"]}, tp=2, workdir=tmp_path,
                       bench={"comm_max_bytes": "lots"})
    with pytest.raises(StageFailed, match="comm_max_bytes"):
        comm.run(ctx)
    ctx.bench = {"comm_ranks": 1000}
    with pytest.raises(StageFailed, match="comm_ranks=1000"):
        comm.run(ctx)
    ctx.bench = {"comm_dtypes": ["float33"]}
    with pytest.raises(StageFailed, match="float33"):
        comm.run(ctx)


def test_the_portal_rejects_malformed_comm_sections_naming_the_path() -> None:
    from django.core.exceptions import ValidationError

    from apps.evidence.services import parse_stage_section

    good = {"ranks": 2, "collectives": [{"op": "all_reduce", "dtype": "float32", "ok": True, "sizes": [
        {"bytes": 1024, "algbw_gbps": 0.1, "busbw_gbps": 0.1, "latency_us": {"p50": 1.0, "p99": 2.0, "max": 3.0}}]}]}
    parse_stage_section("comm", good)
    bad_cases = [
        ({**good, "ranks": 0}, "stages.comm.ranks"),
        ({**good, "collectives": [{**good["collectives"][0], "op": "gossip"}]}, "stages.comm.collectives[0].op"),
        ({**good, "collectives": [{**good["collectives"][0], "ok": "yes"}]}, "stages.comm.collectives[0].ok"),
        ({**good, "collectives": [{**good["collectives"][0], "sizes": [{"bytes": 1, "busbw_gbps": -1}]}]},
         "stages.comm.collectives[0].sizes[0].busbw_gbps"),
        ({**good, "collectives": [good["collectives"][0]] * 300}, "stages.comm.collectives"),
    ]
    for section, path in bad_cases:
        with pytest.raises(ValidationError) as err:
            parse_stage_section("comm", section)
        assert path in err.value.message_dict


@pytest.mark.slow  # 4 loading ranks, a 4-rank server, the benchmark and the collectives: a few minutes here
def test_a_tp2_pp2_moe_job_runs_every_stage_with_comm_and_expert_balance(make_ctx, tmp_path: Path) -> None:
    ctx, _ = make_ctx("qwen3-moe", tp=2, pp=2, workdir=tmp_path,
                      bench={"concurrency": [1, 2, 4], "num_prompts": 4, "input_len": 8, "output_len": 6,
                             "long_context": False, "comm_max_bytes": 16384, "comm_iters": 3})
    report = run_pipeline(ctx, "plan,load,serve,bench,comm")
    assert report["failed_stage"] is None, report["error"]
    stages = report["stages"]
    assert stages["plan"]["plan"] == {"tp": 2, "pp": 2, "ep": 1, "devices": 4, "nodes": 1}
    assert (stages["load"]["tp"], stages["load"]["pp"], len(stages["load"]["ranks"])) == (2, 2, 4)
    for run in stages["bench"]["runs"]:
        assert run["completed"] == 4 and 0 < run["comm_overhead_ratio"] < 1  # rank 0's collectives and sends
        per_rank = run["comm_overhead_ratio_per_rank"]  # every rank timed its own collectives in its own steps
        assert len(per_rank) == 4 and all(0 < r < 1 for r in per_rank) and run["comm_overhead_ratio_max"] == max(per_rank)
        assert run["expert_balance"]["layers"] == 2  # both stages' MoE layers, not stage 0's alone
        assert run["expert_balance"]["routed_tokens"] > 0 and run["tpot_jitter"] >= 1
    comm = stages["comm"]
    assert comm["ranks"] == 4 and {row["op"] for row in comm["collectives"]} == {
        "all_reduce", "all_gather", "reduce_scatter", "broadcast", "send_recv"}
    assert all(row["ok"] for row in comm["collectives"])
