"""The pure verdict rules (``contract.verdicts``) and the threshold table: no database, no torch."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from contract import thresholds as th
from contract import verdicts as v
from contract.manifest import check_manifest
from tests.factories import TINY_LLAMA_CONFIG, tiny_config
from tests.portal.reports import PASSING, failing, passing

HARDWARE = v.HardwareFacts(memory_bytes=80 * 10**9, devices_per_node=8, dtypes=("bfloat16",))
CONTEXT = v.Context(model=v.ModelFacts(config=TINY_LLAMA_CONFIG, context_length=2048), hardware=HARDWARE,
                    dtype="bfloat16")


def judge(stage: str, section: dict, overrides: dict | None = None, context: v.Context = CONTEXT) -> v.Verdict:
    return v.judge(stage, section, overrides, context)


@pytest.mark.parametrize("stage", sorted(PASSING))
def test_honest_passing_sections_pass(stage: str) -> None:
    verdict = judge(stage, passing(stage))
    assert verdict.status == "pass", verdict.reasons
    assert verdict.defaults_version == th.DEFAULTS_VERSION and verdict.reasons == []


@pytest.mark.parametrize("stage", ["plan", "load", "serve", "align", "bench", "eval"])
def test_failing_numbers_fail_whatever_the_flags(stage: str) -> None:
    section = failing(stage)
    flag = v.CLAIM_KEYS.get(stage)
    if flag:
        section[flag] = True  # the agent claims a pass
    verdict = judge(stage, section)
    assert verdict.status == "fail" and verdict.reasons and all(r.startswith(f"{stage}: ") for r in verdict.reasons)
    assert v.claimed(stage, section) is (True if flag else None)


def test_flags_alone_are_never_evidence() -> None:
    for stage, flag in v.CLAIM_KEYS.items():
        assert judge(stage, {flag: True}).status == "incomplete", stage
    assert judge("bench", {}).status == "incomplete" and judge("align", None).status == "incomplete"


def test_the_pipelines_own_claim_does_not_make_a_plan_fit() -> None:
    too_big = v.HardwareFacts(memory_bytes=10**9, devices_per_node=1)  # 1 GB: a 2.2 GB model cannot fit on 1 device
    verdict = judge("plan", passing("plan"), context=v.Context(model=CONTEXT.model, hardware=too_big))
    assert verdict.status == "fail" and "does not fit" in verdict.reasons[0]


def test_plan_without_hardware_facts_uses_the_sections_own_bytes() -> None:
    bare = v.Context()
    section = {**passing("plan"), "bytes_per_device": 3, "memory_per_device": 2}
    assert judge("plan", section, context=bare).reasons == ["plan: needs 3 bytes per device, the device has 2"]
    assert judge("plan", {**section, "memory_per_device": 4}, context=bare).passed


@pytest.mark.parametrize("claimed", [0, -1, 1e30, float("nan"), "3GB", True])
def test_an_absurd_bytes_per_device_fails_the_plan_so_a_claimed_fit_is_disputed(claimed) -> None:  # noqa: ANN001
    section = {**passing("plan"), "bytes_per_device": claimed}
    for context in (CONTEXT, v.Context()):  # recomputed by the portal's planner, or the section's own numbers
        verdict = judge("plan", {**section, "memory_per_device": 2 * 10**9}, context=context)
        assert verdict.status == "fail", (claimed, verdict.reasons)
        assert "is not a memory need per device" in verdict.reasons[0]
        assert v.claimed("plan", section) is True  # the claim the verdict refutes: the cell shows it disputed


def test_a_bytes_per_device_far_from_the_portals_planner_fails_the_plan() -> None:
    # the planner recomputes ~3.47e9 bytes for the tiny Llama at bf16 on one device; the passing claim says 3e9
    assert judge("plan", passing("plan")).passed
    for claimed in (3 * 10**8, 5 * 10**10):
        reasons = judge("plan", {**passing("plan"), "bytes_per_device": claimed}).reasons
        assert len(reasons) == 1 and f"the plan claims {claimed} bytes per device" in reasons[0], reasons
        assert "the portal's planner recomputes 3474378752 for tp=1 pp=1 ep=1 at bfloat16" in reasons[0]
    assert judge("plan", {**passing("plan"), "bytes_per_device": 6 * 10**9}).passed  # within a factor of 2


def test_a_manifest_mismatch_names_the_shard_and_both_digests() -> None:
    manifest = [{"name": "model-00001-of-00002.safetensors", "size": None, "sha256": "a" * 64},
                {"name": "model-00002-of-00002.safetensors", "size": None, "sha256": "e" * 64},
                {"name": "model-00003-of-00003.safetensors", "size": 5, "sha256": "f" * 64}]
    facts = v.ModelFacts(config=TINY_LLAMA_CONFIG, manifest=manifest, declared_tensors=201)
    verdict = judge("load", passing("load"), context=v.Context(model=facts))
    assert verdict.reasons == [
        f"load: shard model-00002-of-00002.safetensors sha256 {'b' * 64} differs from the manifest's {'e' * 64}",
        "load: shard model-00003-of-00003.safetensors of the manifest was not loaded",
    ]


def test_chat_and_image_paths_are_needed_when_the_model_has_them() -> None:
    facts = v.ModelFacts(has_chat_template=True, takes_images=True)
    verdict = judge("serve", passing("serve"), context=v.Context(model=facts))
    assert verdict.status == "incomplete"
    assert verdict.reasons == ["serve: chat path not exercised although the model has a chat template",
                               "serve: image path not exercised although the model takes images"]
    ok = {**passing("serve"), "chat_path_ok": True, "image_path_ok": True}
    assert judge("serve", ok, context=v.Context(model=facts)).passed
    assert judge("serve", {**ok, "chat_path_ok": False}, context=v.Context(model=facts)).reasons == [
        "serve: chat path failed"]


def test_a_fallback_model_without_paged_cache_is_not_asked_for_kv_lengths() -> None:
    section = passing("align")
    section["kv_cache"] = {"lengths": [], "max_abs_err": 0.0, "passed": True, "path": "recompute"}
    native = v.Context(model=v.ModelFacts(config=TINY_LLAMA_CONFIG, runtime_path="native"))
    # a gelu MLP is an option the native layers do not implement: the config itself says fallback
    fallback = v.Context(model=v.ModelFacts(config=tiny_config(hidden_act="gelu"), runtime_path="fallback"))
    assert judge("align", section, context=native).reasons == ["align: kv_cache lengths missing (the sequence "
                                                               "lengths checked)"]
    assert judge("align", section, context=fallback).passed


def test_unrecorded_divergences_need_the_hard_count() -> None:
    section = passing("align")
    section["e2e"]["token_match_rate"] = 60 / 64  # 4 divergent steps, 1 recorded
    del section["e2e"]["hard_divergences"]
    assert judge("align", section).status == "incomplete"
    section["e2e"]["hard_divergences"] = 2
    assert "align: e2e: 2 divergences beyond a near-tie" in judge("align", section).reasons
    section["e2e"]["hard_divergences"] = 0
    assert judge("align", section).passed


def test_a_failure_ratio_threshold_lets_a_few_failures_through() -> None:
    section = passing("bench")
    run = section["runs"][1]
    run.update(failed=1, completed=31, samples={**run["samples"], "ttft_ms": 31, "e2e_ms": 31})  # 1 of 32
    assert judge("bench", section).status == "fail"
    assert judge("bench", section, {"bench_max_failure_ratio": 0.1}).passed
    assert judge("bench", section, {"bench_max_failure_ratio": 0.1}).custom_thresholds == ["bench_max_failure_ratio"]


def test_eval_direction_comes_from_the_metric_not_the_agent() -> None:
    section = passing("eval")
    section["tasks"][0].update(target=0.5, higher_is_better=False)  # an accuracy cannot be lower-is-better
    assert "eval: task arith accuracy 0.5 is below reference 0.91 × (1 − 0.05)" in judge("eval", section).reasons


@pytest.mark.parametrize(("key", "value", "message"), [
    ("op_cosine", 0, "threshold op_cosine: 0 is outside its range (0, 1]"),
    ("op_cosine", math.inf, "threshold op_cosine: inf is outside its range (0, 1]"),
    ("layer_cosine", -0.5, "threshold layer_cosine: -0.5 is outside its range (0, 1]"),
    ("kv_cache_max_abs_err", -1, "threshold kv_cache_max_abs_err: -1 is outside its range [0, inf]"),
    ("e2e_top_k", 1.5, "threshold e2e_top_k: 1.5 is outside its range an integer in [1, 100]"),
    ("eval_rtol", 1.01, "threshold eval_rtol: 1.01 is outside its range [0, 1]"),
    ("op_cosine", True, "threshold op_cosine: True is not a number"),
    ("op_cosine", "x", "threshold op_cosine: 'x' is not a number"),
    ("op_cosin", 0.9, "threshold 'op_cosin' is not read by any stage"),
])
def test_thresholds_outside_their_range_name_key_and_range(key: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(")", r"\)").replace(
            "[", r"\[").replace("]", r"\]")):
        th.check_thresholds({key: value})


def test_lengths_within_the_models_context() -> None:
    with pytest.raises(ValueError, match="longer than the model's context length 2048"):
        th.check_thresholds({"kv_cache_max_len": 4096}, context_length=2048)
    assert th.check_thresholds({"kv_cache_max_len": 2048}, context_length=2048) == {"kv_cache_max_len": 2048}


def test_looser_means_lower_for_minimums_and_higher_for_maximums() -> None:
    assert th.looser_keys({"op_cosine": 0.99, "op_max_rel_err": 0.001, "layer_cosine": 0.999}) == ["op_cosine"]
    assert th.looser_keys({"op_max_rel_err": 0.1, "e2e_top_k": 10, "kv_cache_max_len": 256}) == [
        "e2e_top_k", "kv_cache_max_len", "op_max_rel_err"]
    assert all(row["range"] for row in th.describe()) and {row["key"] for row in th.describe()} == th.known_keys()


def test_manifest_check_normalises_and_bounds() -> None:
    assert check_manifest([{"name": "a.safetensors", "size": 3, "sha256": "AB" * 32}]) == [
        {"name": "a.safetensors", "size": 3, "sha256": "ab" * 32}]
    with pytest.raises(ValueError, match=r"\[0\].sha256 \(a\) must be 64 hexadecimal digits"):
        check_manifest([{"name": "a", "size": 3, "sha256": "zz" * 32}])


def test_verdicts_import_neither_django_nor_torch() -> None:
    code = ("import sys, contract.verdicts, contract.tiers, contract.thresholds; "
            "print(sorted(m for m in ('django', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def test_a_fallback_model_has_no_runtime_operators_to_check() -> None:
    section = passing("align")
    section["ops"] = [{"op": "LlamaAttention", "status": "unchecked", "cosine": None, "passed": None}]
    fallback = v.Context(model=v.ModelFacts(config=tiny_config(hidden_act="gelu"), runtime_path="fallback"))
    assert judge("align", section, context=fallback).passed
    assert judge("align", section).reasons == ["align: ops: no row was checked"]
    section["ops"] = []
    assert judge("align", section).reasons == ["align: ops missing"]


def test_kv_cache_is_judged_by_its_relative_error_when_reported() -> None:
    # real weights: logits of ~30 drift 1.07e-4 absolute, 3.6e-6 relative (SmolLM2-135M fp32) — a pass
    section = passing("align")
    section["kv_cache"] = {**section["kv_cache"], "max_abs_err": 1.07e-4, "max_rel_err": 3.6e-6}
    assert judge("align", section).status == "pass"
    section["kv_cache"]["max_rel_err"] = 2e-5
    assert judge("align", section).reasons == ["align: kv_cache max_rel_err 2e-05 is above 1e-05"]
    section["kv_cache"] = {**section["kv_cache"], "max_rel_err": 1e-7, "blocks_freed": False}
    assert judge("align", section).reasons == [
        "align: kv_cache: blocks were not all returned to the pool after the checks"]


def test_a_model_that_takes_images_needs_its_vision_part_judged_from_the_numbers() -> None:
    images = v.Context(model=v.ModelFacts(config=TINY_LLAMA_CONFIG, context_length=2048, takes_images=True),
                       hardware=HARDWARE, dtype="bfloat16")
    section = passing("align")
    assert judge("align", section, context=images).reasons == [
        "align: vision missing (the image encoder and projector were not compared)"]
    section["vision"] = {"passed": True,
                         "rows": [{"part": "vision_encoder", "image": 0, "cosine": 1.0, "rel_err": 0.0},
                                  {"part": "projector", "image": 0, "cosine": 0.99, "rel_err": 0.0}],
                         "e2e": [{"prompt": "What is it?", "reference": [5, 6, 7], "target": [5, 9, 7],
                                  "match": True}]}
    assert judge("align", section, context=images).reasons == [
        "align: vision projector (image 0) cosine 0.99 is below 0.9999",
        "align: vision e2e prompt 0: greedy tokens differ from the reference at position 1"]
    section["vision"]["rows"][1]["cosine"] = 1.0
    section["vision"]["e2e"][0]["target"] = [5, 6, 7]
    assert judge("align", section, context=images).status == "pass"
    assert judge("align", passing("align")).status == "pass"  # a text-only model is not asked for it
