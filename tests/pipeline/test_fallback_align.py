"""A model on the transformers fallback in fp32 on the CPU is the reference implementation itself: the align
section says so plainly (``fallback_reference_identical``) instead of claiming an alignment, and the report's model
block says which decode path the fallback runs (the paged KV cache, or recompute with the reason)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from agents.pipeline.runner import run_pipeline
from agents.pipeline.stages.align.stage import SELF_REFERENCE
from agents.runtime.testing.make_model import cached_model


def _gelu_llama(tmp_path: Path) -> Path:
    """The tiny Llama with a GELU MLP: an option the native family lacks, so transformers' code runs it."""
    out = tmp_path / "model"
    shutil.copytree(cached_model("llama"), out)
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "hidden_act": "gelu"}))
    return out


def test_align_on_the_fallback_says_the_target_is_the_reference(make_ctx, tmp_path) -> None:
    ctx, _ = make_ctx(_gelu_llama(tmp_path))
    report = run_pipeline(ctx, ["load", "align"])
    assert report["failed_stage"] is None, report["error"]
    assert report["model"]["path"] == "fallback" and report["model"]["fallback_decode"] == "paged"
    align = report["stages"]["align"]
    assert align["fallback_reference_identical"] is True
    assert align["notes"][0].startswith(SELF_REFERENCE)
    assert align["kv_cache"]["path"] == "paged" and align["kv_cache"]["passed"]  # the runtime's attention, checked


def test_a_native_model_claims_no_self_reference(make_ctx) -> None:
    ctx, _ = make_ctx("llama")
    report = run_pipeline(ctx, ["load", "align"])
    assert report["model"]["path"] == "native" and "fallback_decode" not in report["model"]
    assert "fallback_reference_identical" not in report["stages"]["align"]
