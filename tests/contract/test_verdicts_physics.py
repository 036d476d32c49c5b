"""The pure physics and consistency rules of the bench and align verdicts (no database, no torch)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from contract import verdicts as v
from contract.verdicts.align import reduced_dtype, runtime_path
from contract.verdicts.bench import decode_floor_bytes
from tests.factories import TINY_LLAMA_CONFIG, tiny_config
from tests.portal.reports import passing

CONFIGS = Path(__file__).resolve().parents[2] / "contract" / "data" / "configs"
H100 = v.HardwareFacts(memory_bytes=80 * 10**9, devices_per_node=8, memory_bandwidth_gbps=3350.0)
CONTEXT = v.Context(model=v.ModelFacts(config=TINY_LLAMA_CONFIG), hardware=H100, dtype="bfloat16",
                    layout={"tp": 1, "pp": 1, "ep": 1})


def _config(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text())


def test_the_floor_is_the_active_weights_per_device_plus_one_prompts_kv() -> None:
    one = decode_floor_bytes(TINY_LLAMA_CONFIG, "bfloat16", 1, 1, 1)
    assert 2.0e9 < one < 2.3e9  # ~1.1 B parameters at 2 bytes (the embedding lookup is not read whole)
    assert decode_floor_bytes(TINY_LLAMA_CONFIG, "float32", 1, 1, 1) == pytest.approx(2 * one, rel=0.01)
    eight = decode_floor_bytes(TINY_LLAMA_CONFIG, "bfloat16", 8, 1, 1)
    assert one / 8 <= eight < one / 7  # attention, MLP and head split over tp; norms replicated
    kv = decode_floor_bytes(TINY_LLAMA_CONFIG, "bfloat16", 1, 1, 1001) - one
    assert kv == 1000 * 2 * 22 * 4 * 64 * 2  # 1000 more tokens × K and V × layers × kv heads × head dim × bytes
    moe = _config("qwen3-30b-a3b")
    active = decode_floor_bytes(moe, "bfloat16", 1, 1, 1)
    assert 4.5e9 < active < 7e9  # ~3.3 B active of 30.5 B: only the routed experts a token uses
    assert decode_floor_bytes(moe, "bfloat16", 1, 8, 1) < active / 2  # experts spread over 8 EP ranks


def test_a_tpot_below_the_floor_fails_and_the_factor_is_a_versioned_threshold() -> None:
    floor_ms = decode_floor_bytes(TINY_LLAMA_CONFIG, "bfloat16", 1, 1, 128) / 3350e9 * 1000  # ~0.62 ms
    section = passing("bench")
    for run in section["runs"]:
        run["tpot_ms"] = run["itl_ms"] = {"mean": 0.2, "p50": 0.2, "p90": 0.25, "p99": 0.3}
    verdict = v.judge("bench", section, context=CONTEXT)
    assert verdict.status == "fail"
    assert any(f"TPOT p50 0.2 ms is below the physical floor {floor_ms:.4g} ms" in r and "over 3350 GB/s" in r
               for r in verdict.reasons), verdict.reasons
    loose = v.judge("bench", section, {"bench_tpot_floor_factor": 0.1}, context=CONTEXT)
    assert not any("physical floor" in r for r in loose.reasons)
    assert loose.custom_thresholds == ["bench_tpot_floor_factor"]
    assert v.judge("bench", passing("bench"), context=CONTEXT).passed


def test_an_unknown_bandwidth_config_or_layout_is_noted_never_silently_passed() -> None:
    no_bw = v.Context(model=CONTEXT.model, hardware=v.HardwareFacts(memory_bytes=1, devices_per_node=1))
    assert "bench: TPOT floor not checked: the hardware states no memory bandwidth" in v.judge(
        "bench", passing("bench"), context=no_bw).notes
    no_config = v.Context(hardware=H100)
    assert "bench: TPOT floor not checked: the model's config is not known" in v.judge(
        "bench", passing("bench"), context=no_config).notes
    no_layout = v.Context(model=CONTEXT.model, hardware=H100, dtype="bfloat16")
    verdict = v.judge("bench", passing("bench"), context=no_layout)
    assert verdict.passed and any("assumed tp=ep=8 (the lowest floor on one node)" in n for n in verdict.notes)


def test_counts_rates_and_samples_must_agree() -> None:
    section = passing("bench")
    section["runs"][0]["duration_s"] *= 2  # req/s × duration no longer the completed requests
    reasons = v.judge("bench", section, context=CONTEXT).reasons
    assert any("req_s" in r and "is not the 32 requests it completed" in r for r in reasons), reasons
    section = passing("bench")
    del section["runs"][2]["samples"]
    verdict = v.judge("bench", section, context=CONTEXT)
    assert verdict.status == "incomplete"
    assert "bench: run at concurrency 16: samples missing (the count of requests behind each percentile)" in \
        verdict.reasons
    section = passing("bench")
    section["runs"][0]["ttft_ms"]["p99"] = 2000.0  # beyond its own end to end p99
    assert any("TTFT p99 2000 ms exceeds end-to-end p99" in r for r in v.judge("bench", section).reasons)


def test_a_level_shorter_than_the_minimum_fails_and_a_topped_up_level_may_issue_more() -> None:
    section = passing("bench")
    section["runs"][2]["duration_s"] = 1.0
    section["runs"][2]["req_s"] = 32.0
    section["runs"][2]["output_tok_s"] = 2048.0
    reasons = v.judge("bench", section, context=CONTEXT).reasons
    assert "bench: run at concurrency 16: ran 1 s, a baseline level runs at least 2 s" in reasons
    section = passing("bench")
    run = section["runs"][0]
    run.update(prompts=40, completed=40, samples={**run["samples"], "ttft_ms": 40, "e2e_ms": 40},
               output_tokens=40 * 64, duration_s=run["duration_s"] * 40 / 32)
    assert any("completed + failed = 40, the level was asked 32" in r for r in v.judge("bench", section).reasons)
    section["requested"]["min_seconds"] = 2.0  # the harness ran on with fresh prompts to its minimum seconds
    assert v.judge("bench", section, context=CONTEXT).passed


def test_the_repeated_prompt_probe_is_compared_with_the_faster_fresh_run_at_its_level() -> None:
    section = passing("bench")
    top = section["runs"][-1]["output_tok_s"]
    section["probe"]["fresh"]["output_tok_s"] = round(top / 2, 3)  # the probe's fresh run slowed by a busy host
    section["probe"]["repeated"]["output_tok_s"] = round(top * 1.05, 3)
    assert v.judge("bench", section, context=CONTEXT).passed  # the sweep's fresh level ran as fast
    section["probe"]["repeated"]["output_tok_s"] = round(top * 1.5, 3)  # faster than any fresh run: a cache
    reasons = v.judge("bench", section, context=CONTEXT).reasons
    assert any(f"is 1.50× the fresh prompts' {top:g}" in r for r in reasons), reasons


def test_align_rows_in_range_and_exact_zeros_only_where_a_lookup_copies() -> None:
    section = passing("align")
    section["ops"].append({"op": "embedding", "check": "embedding", "cosine": 1.0, "max_rel_err": 0.0,
                           "max_abs_err": 0.0, "passed": True})
    context = v.Context(model=v.ModelFacts(config=TINY_LLAMA_CONFIG), dtype="bfloat16")
    assert v.judge("align", section, context=context).passed  # a lookup is exact at any precision
    section["ops"][0].update(max_rel_err=0.0, max_abs_err=0.0)
    assert "align: op matmul: exactly zero error at bfloat16 is not a measurement" in v.judge(
        "align", section, context=context).reasons
    assert v.judge("align", section, context=v.Context(model=context.model, dtype="float32")).passed
    assert reduced_dtype("auto", {"torch_dtype": "bfloat16"}) == "bfloat16"
    assert reduced_dtype("fp8", {}) == "float8_e4m3fn" and reduced_dtype("float32", {}) is None
    section = passing("align")
    section["layers"][0]["cosine"] = -1.2
    assert "align: layer 0 cosine -1.2 is outside [-1, 1]" in v.judge("align", section).reasons
    section = passing("align")
    section["kv_cache"]["max_abs_err"] = -1e-6
    assert "align: kv_cache max_abs_err -1e-06 is not an error (a number of at least 0)" in v.judge(
        "align", section).reasons


def test_the_runtime_path_comes_from_the_config_not_the_load_section() -> None:
    said = v.Context(model=v.ModelFacts(config=TINY_LLAMA_CONFIG, runtime_path="fallback"))
    assert runtime_path(said) == ("native", "the config")
    gelu = v.Context(model=v.ModelFacts(config=tiny_config(hidden_act="gelu"), runtime_path="native"))
    assert runtime_path(gelu) == ("fallback", "the config")
    assert runtime_path(v.Context(model=v.ModelFacts(runtime_path="fallback"))) == ("fallback", "the load section")


def test_a_low_token_match_fails_whatever_the_divergences_say() -> None:
    section = passing("align")
    section["e2e"].update(token_match_rate=0.5, divergences=[], hard_divergences=0)
    assert "align: e2e token match rate 0.5000 is below the minimum 0.9" in v.judge("align", section).reasons
    assert not any("token match" in r for r in v.judge("align", section, {"align_min_token_match": 0.4}).reasons)
