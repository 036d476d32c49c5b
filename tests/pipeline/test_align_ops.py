"""Operator checks on the runtime's own modules: every module class the model uses is checked against an
independent float64 reference, unchecked ones are listed, and a planted bug fails at the operator holding it."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from torch import nn

from agents.pipeline.runner import run_pipeline
from agents.pipeline.stages.align import ops as align_ops
from agents.pipeline.stages.align.op_checks import check_linear
from agents.pipeline.stages.align.probe import compare, make_probe
from agents.runtime.layers import grouped_router
from agents.runtime.models.deepseek_v3 import DeepseekV3ForCausalLM
from agents.runtime.models.registry import build_model, register
from agents.runtime.testing.make_model import cached_model
from contract.sections import ROW_KEYS

PLANTED = "PlantedBugDeepseekV3ForCausalLM"


class BiasDroppingRouter(grouped_router.GroupedTopKRouter):
    """DeepSeek-V3's router with the planted bug: the score-correction bias never steers the choice."""

    def forward(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = nn.functional.linear(hidden.float(), self.weight)
        return grouped_router.grouped_topk(logits, self.top_k, self.n_group, self.topk_group, correction_bias=None,
                                           scoring=self.scoring, renormalize=self.renormalize,
                                           scaling_factor=self.scaling_factor)


@register(PLANTED)
class PlantedBugDeepseekV3(DeepseekV3ForCausalLM):
    """A copy of the DeepSeek-V3 family whose MoE layers use the bias-dropping router."""

    def make_mlp(self, layer: int) -> nn.Module:
        mlp = super().make_mlp(layer)
        if isinstance(getattr(mlp, "gate", None), grouped_router.GroupedTopKRouter):
            mlp.gate.__class__ = BiasDroppingRouter
        return mlp


def _config(arch: str) -> dict:
    return json.loads((cached_model(arch) / "config.json").read_text())


def _rows(arch: str, dtype: torch.dtype = torch.float32, **overrides) -> list[dict]:
    config = {**_config(arch), **overrides}
    return align_ops.run_checks(build_model(config, dtype=dtype), config)


def test_compare_defines_normwise_relative_error():
    ref = torch.tensor([1.0, -4.0, 0.0])
    out = torch.tensor([1.0, -4.0, 0.5])  # an error of 0.5 where the reference is 0
    m = compare(ref, out)
    assert m["max_abs_err"] == pytest.approx(0.5)
    assert m["max_rel_err"] == pytest.approx(0.5 / 4.0)  # relative to max |ref|, not to the zero element
    assert m["cosine"] == pytest.approx(17 / math.sqrt(17 * 17.25))


def test_compare_flags_non_finite_target():
    m = compare(torch.ones(3), torch.tensor([1.0, float("nan"), 1.0]))
    assert m["max_rel_err"] == float("inf") and math.isnan(m["cosine"])


FAMILY_OPS = {
    "llama": {"attention", "embedding", "lm_head", "linear", "rms_norm", "rope", "self_attention", "swiglu_mlp"},
    "qwen3": {"attention", "embedding", "lm_head", "linear", "rms_norm", "rope", "self_attention", "swiglu_mlp"},
    "mixtral": {"attention", "embedding", "lm_head", "linear", "rms_norm", "rope", "self_attention", "router",
                "moe_experts"},
    "qwen3-moe": {"attention", "embedding", "lm_head", "linear", "rms_norm", "rope", "self_attention", "router",
                  "moe_experts"},
    "deepseek-v3": {"embedding", "lm_head", "linear", "rms_norm", "rope", "mla", "router", "moe_experts",
                    "swiglu_mlp"},
}


@pytest.mark.parametrize("arch", sorted(FAMILY_OPS))
def test_every_module_class_of_each_family_is_checked_and_exact_in_float32(arch: str):
    rows = _rows(arch)
    assert {row["check"] for row in rows} == FAMILY_OPS[arch]
    assert len({row["op"] for row in rows}) == len(rows)  # every row's name is unique
    assert not [row for row in rows if row["status"] == "unchecked"]
    for row in rows:
        assert all(k in row for k in ROW_KEYS[("align", "ops")]), row
        assert row["passed"] and row["cosine"] > 0.99999 and row["max_rel_err"] < 1e-4, row


def test_the_checks_run_the_models_own_classes_and_layouts():
    rows = _rows("deepseek-v3")
    router = next(row for row in rows if row["check"] == "router")
    assert router["module"] == "GroupedTopKRouter" and "correction bias" in router["rule"]
    assert next(row for row in rows if row["check"] == "rope")["interleaved"] is True  # DeepSeek's layout
    assert {row["op"] for row in rows if row["check"] == "mla"} == {"mla prefill", "mla paged prefill + absorbed decode"}
    assert {row["module"] for row in rows if row["check"] == "linear"} == {
        "ReplicatedLinear", "ColumnParallelLinear", "MergedColumnParallelLinear", "RowParallelLinear"}
    llama = _rows("llama")
    assert next(row for row in llama if row["check"] == "rope")["interleaved"] is False
    assert next(row for row in _rows("qwen3") if row["check"] == "self_attention")["qk_norm"] is True


def test_a_column_major_weight_is_checked_in_its_own_layout():
    from agents.runtime.layers.weights import column_major

    config = _config("llama")
    model = build_model(config)
    gate_up = model.model.layers[0].mlp.gate_up_proj
    assert column_major(gate_up.weight) and gate_up.weight.stride(0) == 1  # the decode layout
    probe = make_probe("gate_up", gate_up, config, torch.float32, 0)
    assert probe.params["weight"].stride() == gate_up.weight.stride()
    assert all(row["cosine"] > 0.99999 for row in check_linear(probe))


def test_bfloat16_is_within_default_thresholds_but_not_exact():
    rows = _rows("mixtral", torch.bfloat16)
    assert all(row["passed"] for row in rows), [row for row in rows if not row["passed"]]
    linear = next(row for row in rows if row["check"] == "linear")
    assert linear["max_rel_err"] > 1e-4  # bf16 rounding is visible: the check measures something


def test_thresholds_override_fails_operators():
    config = _config("llama")
    rows = align_ops.run_checks(build_model(config, dtype=torch.bfloat16), config, thresholds={"op_max_rel_err": 1e-6})
    assert not any(row["passed"] for row in rows if row["check"] == "linear")


def test_the_planted_router_bug_fails_at_the_router_only():
    rows = _rows("deepseek-v3", architectures=[PLANTED])
    failed = [row for row in rows if not row["passed"]]
    assert [(row["op"], row["module"]) for row in failed] == [("router", "BiasDroppingRouter")]
    assert failed[0]["hard_topk_agreement"] < 1 and "expert choice differs" in failed[0]["problem"]


def test_a_wrong_rope_layout_fails_rope_and_mla():
    config = _config("deepseek-v3")
    model = build_model(config)
    model.rotary.interleaved = False  # Llama's layout in a DeepSeek model
    failed = {row["check"] for row in align_ops.run_checks(model, config) if not row["passed"]}
    assert failed == {"rope", "mla"}


def test_a_module_without_a_check_is_listed_unchecked_not_passed():
    config = _config("llama")
    model = build_model(config)
    model.model.layers[0].extra_scale = nn.Linear(4, 4)  # a torch module the runtime has no check for
    rows = align_ops.run_checks(model, config)
    [unchecked] = [row for row in rows if row["status"] == "unchecked"]
    assert unchecked["op"] == "Linear" and unchecked["passed"] is None and unchecked["where"] == "model.layers.0.extra_scale"
    assert "no operator check" in unchecked["reason"]


def test_the_transformers_fallback_has_no_runtime_operator_to_check():
    config = {**_config("llama"), "architectures": ["SomeNewArchForCausalLM"]}
    [row] = align_ops.run_checks(build_model(config), config)
    assert row["status"] == "unchecked" and "fallback" in row["reason"]


def test_the_planted_router_bug_fails_the_align_stage_at_the_router(make_ctx, tmp_path: Path, monkeypatch) -> None:
    from contract.model import native

    # registered as a native family above: the portal's torch-free list of native families says so too
    monkeypatch.setitem(native.NATIVE_FAMILIES, PLANTED, "deepseek_v3")
    model_dir = tmp_path / "planted"
    shutil.copytree(cached_model("deepseek-v3"), model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, "architectures": [PLANTED]}))
    ctx, _ = make_ctx(model_dir)
    report = run_pipeline(ctx, "load,align")
    assert report["failed_stage"] == "align", report["error"]
    ops = report["stages"]["align"]["ops"]
    assert [row["op"] for row in ops if row["status"] == "failed"] == ["router"]
    assert report["error"].startswith("align: op router cosine")  # the verdict names the operator first
    assert report["verdicts"]["align"]["status"] == "fail"
