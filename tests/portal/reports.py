"""Stage report sections (docs/stage-report.md) for tests: passing ones, and how each stage fails."""

from __future__ import annotations

import copy
from typing import Any

BENCH_LEVELS = (1, 4, 16)
BENCH_PROMPTS, BENCH_OUTPUT_LEN = 32, 64
TPOT = {"mean": 10.0, "p50": 9.5, "p90": 12.0, "p99": 15.0}  # jitter p99/p50 1.58


def bench_run(c: int, *, prompts: int = BENCH_PROMPTS, in_flight: float = 0.9) -> dict[str, Any]:
    """One level of a physically plausible run: TPOT 10 ms (the factory model reads ~2.1 GB a step; at 3350 GB/s
    the floor is ~0.6 ms), TTFT 20 ms × c, ``output_len`` 64 tokens each, ``in_flight`` × c requests in flight."""
    ttft, tpot = 20.0 * c, 10.0
    e2e = ttft + (BENCH_OUTPUT_LEN - 1) * tpot
    duration = prompts * e2e / 1000 / (in_flight * c)
    tokens = prompts * BENCH_OUTPUT_LEN

    def pct(mean: float) -> dict[str, float]:
        return {"mean": mean, "p50": round(mean * 0.98, 3), "p90": round(mean * 1.1, 3), "p99": round(mean * 1.25, 3)}

    return {"concurrency": c, "prompts": prompts, "completed": prompts, "failed": 0, "duration_s": round(duration, 3),
            "ttft_ms": pct(ttft), "tpot_ms": dict(TPOT), "itl_ms": dict(TPOT), "e2e_ms": pct(e2e),
            "output_tokens": tokens, "output_tok_s": round(tokens / duration, 3),
            "req_s": round(prompts / duration, 3),
            "samples": {"ttft_ms": prompts, "tpot_ms": prompts, "itl_ms": prompts * 62, "e2e_ms": prompts},
            "p99_is_max": ["e2e_ms", "tpot_ms", "ttft_ms"]}


def bench_section() -> dict[str, Any]:
    runs = [bench_run(c) for c in BENCH_LEVELS]
    top = runs[-1]
    probe = {"concurrency": top["concurrency"],
             "fresh": {"completed": BENCH_PROMPTS, "failed": 0, "output_tok_s": top["output_tok_s"]},
             "repeated": {"completed": BENCH_PROMPTS, "failed": 0, "output_tok_s": round(top["output_tok_s"] * 1.02, 3)}}
    return {"requested": {"concurrency": list(BENCH_LEVELS), "num_prompts": BENCH_PROMPTS, "input_len": 128,
                          "output_len": BENCH_OUTPUT_LEN, "ignore_eos": True, "min_seconds": 0.0},
            "input_len": 128, "output_len": BENCH_OUTPUT_LEN, "num_prompts": BENCH_PROMPTS, "runs": runs,
            "probe": probe}


PASSING: dict[str, dict[str, Any]] = {
    "plan": {"params_total": 1_100_048_384, "params_active": 1_100_048_384, "weight_bytes": 2_200_096_768,
             "kv_bytes_per_token": 22528, "plan": {"tp": 1, "pp": 1, "ep": 1, "devices": 1}, "fits": True,
             "bytes_per_device": 3_000_000_000},
    "load": {"ok": True, "tensors": 201, "bytes": 2_200_096_768, "seconds": 1.5, "gb_per_s": 1.47,
             "peak_rss_bytes": 2_600_000_000,
             "shards": [{"file": "model-00001-of-00002.safetensors", "sha256": "a" * 64},
                        {"file": "model-00002-of-00002.safetensors", "sha256": "b" * 64}],
             "problems": []},
    "inventory": {"ops": [{"op": "aten::mm", "count": 154, "dtypes": ["bfloat16"], "status": "native",
                           "decomposes_to": []},
                          {"op": "aten::silu", "count": 22, "dtypes": ["bfloat16"], "status": "decomposed",
                           "decomposes_to": ["aten::sigmoid", "aten::mul"]},
                          {"op": "aten::_scaled_dot_product_flash_attention", "count": 22, "dtypes": ["bfloat16"],
                           "status": "fallback", "decomposes_to": []}],
                  "summary": {"native": 1, "decomposed": 1, "fallback": 1, "missing": 0}},
    "align": {"passed": True, "thresholds": {"op_cosine": 0.999, "layer_cosine": 0.99},
              "ops": [{"op": "matmul", "cosine": 0.99999, "max_rel_err": 1e-4, "max_abs_err": 1e-5, "passed": True,
                       "aten_ops": ["aten::mm"]},
                      {"op": "attention", "cosine": 0.99998, "max_rel_err": 2e-4, "max_abs_err": 1e-5,
                       "passed": True, "aten_ops": ["aten::_scaled_dot_product_flash_attention"]},
                      {"op": "swiglu_mlp", "cosine": 0.99999, "max_rel_err": 3e-4, "max_abs_err": 1e-5,
                       "passed": True, "aten_ops": ["aten::mm", "aten::silu"]},
                      {"op": "rmsnorm", "cosine": 0.99999, "max_rel_err": 1e-4, "max_abs_err": 1e-5,
                       "passed": True, "aten_ops": []}],
              # one row per decoder layer of the factory's model (22 layers)
              "layers": [{"layer": i, "cosine": 0.9999 - i * 1e-6, "max_rel_err": 1e-3, "passed": True}
                         for i in range(22)],
              "e2e": {"prompts": 4, "tokens": 64, "token_match_rate": 63 / 64, "hard_divergences": 0,
                      "divergences": [{"prompt": 2, "position": 17, "ref_token": 311, "target_token": 279,
                                       "ref_top5": [[311, -0.69], [279, -0.70]], "target_top5": [[279, -0.69],
                                                                                                  [311, -0.70]],
                                       "near_tie": True}],
                      "perplexity_ref": 12.1, "perplexity_target": 12.1},
              "kv_cache": {"lengths": [512, 2048], "max_abs_err": 1e-5, "passed": True}},
    "serve": {"ready_seconds": 3.2, "endpoint": "http://127.0.0.1:8100", "text_path_ok": True,
              "checks": [{"name": "completions", "ok": True, "detail": " Paris"},
                         {"name": "completions_stream", "ok": True, "detail": "9 chunks"}]},
    "bench": bench_section(),
    "env": {"runtime_commit": "abc1234", "torch": "2.13.0", "python": "3.11.7", "device": "cpu", "device_count": 1,
            "dispatch_key": "CPU", "driver": ""},
    "eval": {"passed": True,
             "tasks": [{"task": "arith", "metric": "accuracy", "reference": 0.91, "target": 0.9, "n": 200,
                        "wilson_low": 0.85, "passed": True},
                       {"task": "wikitext", "metric": "perplexity", "reference": 12.0, "target": 12.1, "n": 50,
                        "wilson_low": None, "passed": True}],
             "needle": {"lengths": [256, 1024], "depths": [0.0, 0.5, 1.0],
                        "reference": [[1.0, 1.0, 1.0], [1.0, 0.5, 1.0]], "target": [[1.0, 1.0, 1.0], [1.0, 1.0, 0.5]]}},
}

# What makes each stage's section fail the verdict: failing numbers (with the agent's honest flags).
FAILING_PATCH: dict[str, dict[str, Any]] = {
    # 32 heads do not split over tp=3: the portal's planner finds no valid plan
    "plan": {"fits": False, "plan": {"tp": 3, "pp": 1, "ep": 1, "devices": 3}},
    "load": {"ok": False, "problems": [{"tensor": "model.layers.0.mlp.up_proj.weight", "problem": "shape mismatch"}]},
    "serve": {"text_path_ok": False, "checks": [{"name": "completions", "ok": False, "detail": "HTTP 500"}]},
    "align": {"passed": False, "layers": [{"layer": i, "cosine": 0.9999 if i < 17 else 0.95, "max_rel_err": 0.2,
                                           "passed": i < 17} for i in range(22)]},
    "bench": {"runs": [{**run, "failed": 8, "completed": 0, "output_tok_s": 0.0} for run in PASSING["bench"]["runs"]]},
    # raw outputs that answer no challenge (the portal scores raw outputs; the agent's tasks are claims)
    "eval": {"passed": False, "raw": {"nonce": "", "mc": []}, "tasks": [{"task": "arith", "metric": "accuracy", "reference": 0.91, "target": 0.6,
                                         "n": 200, "wilson_low": 0.53, "passed": False}]},
}

# tier -> the stages a job must pass to reach it (in order)
TIER_STAGES: dict[int, list[str]] = {
    1: ["plan"], 2: ["plan", "load"], 3: ["plan", "load", "serve"], 4: ["plan", "load", "serve", "align"],
    5: ["plan", "load", "serve", "align", "bench"], 6: ["plan", "load", "serve", "align", "bench", "eval"],
}


def passing(stage: str) -> dict[str, Any]:
    return copy.deepcopy(PASSING[stage])


def failing(stage: str) -> dict[str, Any]:
    section = passing(stage)
    section.update(copy.deepcopy(FAILING_PATCH[stage]))
    return section


def bound(job: Any, doc: Any) -> Any:
    """``doc`` with the binding an agent posts beside it: the job's current attempt and nonce (read afresh)."""
    from apps.jobs.models import Job

    if not isinstance(doc, dict):
        return doc
    attempts, nonce = Job.objects.values_list("attempts", "nonce").get(pk=job.pk)
    return {**doc, "attempt": attempts, "nonce": nonce}


def new_attempt(job: Any) -> None:
    """The job goes out again (as a re-dispatch would): the next attempt and a fresh nonce."""
    import secrets

    from django.db.models import F

    from apps.jobs.models import Job

    Job.objects.filter(pk=job.pk).update(attempts=F("attempts") + 1, nonce=secrets.token_hex(16))
    job.refresh_from_db()
