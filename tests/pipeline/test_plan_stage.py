"""The plan stage on its own and through the runner: fits, does not fit (and by how much), overrides."""

from __future__ import annotations

import pytest

from agents.pipeline.runner import run_pipeline
from agents.pipeline.stages.plan import run
from agents.pipeline.support.context import StageContext
from agents.pipeline.support.errors import StageFailed
from contract.hardware import find_config, get_hardware
from contract.sections import section_problems

TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 512, "hidden_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96,
        "max_position_embeddings": 256}


def ctx_for(config: dict, hardware: dict, **kw) -> StageContext:
    return StageContext(model_dir=None, config=config, hardware=hardware, emit_fn=lambda *a, **k: None, **kw)


def test_catalog_slug_only_is_enough() -> None:
    section = run(ctx_for(find_config("llama-3.1-8b"), {"slug": "nvidia-h100-sxm"}, dtype="bfloat16"))
    assert section["fits"] and section["plan"]["devices"] == 1 and section["hardware"] == "nvidia-h100-sxm"
    assert section_problems("plan", section) == []


def test_tiny_model_fits_this_host() -> None:
    section = run(ctx_for(TINY, get_hardware("cpu").to_dict()))
    assert section["fits"] and section["dtype"] == "float32" and section["max_context"] == 256


def test_overrides_are_honoured() -> None:
    ctx = ctx_for(find_config("qwen3-30b-a3b"), {"slug": "nvidia-h100-sxm"}, dtype="bfloat16", tp=2, ep=2)
    assert run(ctx)["plan"] == {"tp": 2, "pp": 1, "ep": 2, "devices": 2, "nodes": 1}
    cpu = get_hardware("cpu").to_dict()
    section = run(ctx_for(TINY, cpu, tp=2))
    assert section["plan"]["tp"] == 2 and section["memory_per_device"] == cpu["memory_bytes"] // 2


def test_invalid_override_is_refused() -> None:
    with pytest.raises(StageFailed, match="tp=3"):
        run(ctx_for(TINY, {"memory_gb": 8, "devices_per_node": 1}, tp=3))
    with pytest.raises(StageFailed, match="positive"):
        run(ctx_for(TINY, {"memory_gb": 8, "devices_per_node": 1}, tp=0))


def test_not_fitting_keeps_the_section_and_fails_with_the_shortfall() -> None:
    ctx = ctx_for(find_config("llama-3.1-70b"), {"slug": "tiny-gpu", "memory_gb": 16, "devices_per_node": 1, "max_nodes": 2},
                  dtype="bfloat16")
    report = run_pipeline(ctx, ["plan"])
    assert report["failed_stage"] == "plan" and report["tier"] == 0
    assert "short by" in report["error"] and "GiB" in report["error"]
    assert report["stages"]["plan"]["fits"] is False and report["stages"]["plan"]["shortfall_bytes"] > 0


def test_fitting_plan_reaches_tier_1() -> None:
    report = run_pipeline(ctx_for(TINY, {"slug": "cpu"}), ["plan"])
    assert report["tier"] == 1 and report["error"] is None


@pytest.mark.parametrize("config,hardware,match", [
    ({k: v for k, v in TINY.items() if k != "vocab_size"}, {"memory_gb": 8}, "vocab_size"),
    (TINY, {}, "hardware"),
    (TINY, {"slug": "no-such-chip"}, "no-such-chip"),
    (TINY, {"memory_gb": "lots"}, "not numbers"),
])
def test_bad_input_is_named(config: dict, hardware: dict, match: str) -> None:
    with pytest.raises(StageFailed, match=match):
        run(ctx_for(config, hardware))
