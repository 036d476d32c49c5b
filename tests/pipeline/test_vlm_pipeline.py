"""The tiny LLaVA (native decoder) and the tiny Qwen2.5-VL (transformers fallback: dynamic resolution, patch
merger) through the pipeline: the judge knows they take images (the serve verdict then needs the image path);
align compares the vision encoder and projector (merger) and greedy image + text e2e against transformers;
``day0 adapt`` reaches tier >= 4 with the image path checked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agents.pipeline.runner import judging_context
from agents.runtime.testing.make_model import cached_model
from contract import verdicts
from day0cli.main import main

SERVE_OK = {"ready_seconds": 1.0, "endpoint": "http://127.0.0.1:1", "text_path_ok": True, "chat_path_ok": True,
            "checks": []}


def test_the_judge_requires_the_image_path_of_a_model_that_takes_images(make_ctx):
    ctx, _ = make_ctx("llava")
    context = judging_context(ctx)
    assert context.model.takes_images is True
    assert verdicts.judge("serve", SERVE_OK, context=context).status == verdicts.INCOMPLETE
    assert verdicts.judge("serve", {**SERVE_OK, "image_path_ok": False}, context=context).status == verdicts.FAIL
    assert verdicts.judge("serve", {**SERVE_OK, "image_path_ok": True}, context=context).status == verdicts.PASS
    text_ctx, _ = make_ctx("llama")
    assert judging_context(text_ctx).model.takes_images is False


@pytest.mark.parametrize("arch", [pytest.param("llava", marks=pytest.mark.slow), "qwen2.5-vl"])
def test_align_vision_part_equals_transformers(make_ctx, arch):
    from agents.pipeline.stages.align import vision as align_vision

    ctx, _ = make_ctx(arch)
    part = align_vision.run(ctx)
    assert part["passed"], part
    assert {(r["part"], r["image"]) for r in part["rows"]} == {(p, i) for p in ("vision_encoder", "projector")
                                                                for i in (0, 1)}
    assert all(r["cosine"] > 0.99999 and r["rel_err"] < 1e-5 for r in part["rows"])
    assert all(p["match"] and len(p["reference"]) == align_vision.NEW_TOKENS for p in part["e2e"])


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["llava", "llava-siglip", "qwen2-vl", "qwen2.5-vl", "qwen3-vl"])
def test_adapt_a_vlm_reaches_tier_4_with_its_image_path(tmp_path: Path, capsys, arch) -> None:
    report_file = tmp_path / "report.json"
    rc = main(["adapt", str(cached_model(arch)), "--hardware", "cpu", "--report", str(report_file), "--quiet",
               "--stages", "plan,load,inventory,align,serve,bench", "--workdir", str(tmp_path / "work")])
    report = json.loads(report_file.read_text())
    assert rc == 0, capsys.readouterr().out
    assert report["tier"] >= 4 and report["failed_stage"] is None
    stages = report["stages"]
    assert stages["plan"]["params_total"] > stages["plan"]["spec"]["vision_params"] > 0
    assert stages["align"]["passed"] and stages["align"]["checks"]["vision"] is True
    assert stages["align"]["vision"]["e2e"] and all(p["match"] for p in stages["align"]["vision"]["e2e"])
    serve = stages["serve"]
    assert serve["image_path_ok"] is True
    assert {c["name"] for c in serve["checks"] if c["ok"]} >= {"image_chat", "image_chat_stream"}
    assert report["verdicts"]["serve"]["status"] == "pass"


def test_inventory_covers_the_vision_encoders_operators(make_ctx):
    from agents.pipeline.stages.inventory import stage as inventory

    ctx, _ = make_ctx("llava")
    section = inventory.run(ctx)
    ops = {row["op"]: row for row in section["ops"]}
    for op in ("aten.conv2d.default", "aten.layer_norm.default", "aten.gelu.default", "aten.index_copy_.default"):
        assert op in ops and ops[op]["status"] != "missing", op  # patch conv, CLIP norms, projector GELU, splice
    assert "aten.randn.generator" not in ops  # the probe image is made outside the trace
    assert section["summary"]["missing"] == 0


def test_inventory_covers_a_dynamic_resolution_encoders_operators(make_ctx):
    from agents.pipeline.stages.inventory import stage as inventory

    ctx, _ = make_ctx("qwen2.5-vl")
    section = inventory.run(ctx)
    ops = {row["op"]: row for row in section["ops"]}
    assert section["path"] == "fallback"
    for op in ("aten.conv3d.default", "aten.argsort.default", "aten.gelu.default", "aten.silu.default",
               "aten.masked_scatter.default"):
        assert op in ops and ops[op]["status"] != "missing", op  # patch conv, window order, merger, MLP, splice
    assert "aten.randn.generator" not in ops  # the probe patches are made outside the trace
    assert section["summary"]["missing"] == 0
