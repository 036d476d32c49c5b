"""The align stage against transformers fp32: a faithful target passes, a perturbed weight is caught per layer
and end to end, near-ties are told apart from real divergences, absent parts are noted."""

from __future__ import annotations

import torch

from agents.pipeline.runner import run_pipeline
from agents.pipeline.stages.align.e2e import compare_step


def _perturb(model: torch.nn.Module, layer: int) -> str:
    """Add noise to one projection weight of decoder block ``layer`` in the loaded target (not on disk)."""
    names = [n for n, p in model.named_parameters() if f"layers.{layer}." in n and p.dim() == 2]
    name = next(n for n in names if "o_proj" in n)
    param = dict(model.named_parameters())[name]
    with torch.no_grad():
        param.add_(torch.randn(param.shape, generator=torch.Generator().manual_seed(0)) * 0.5)
    return name


def test_a_perturbed_weight_fails_align_from_that_layer_with_the_divergence_reported(make_ctx) -> None:
    ctx, _ = make_ctx("llama")
    assert run_pipeline(ctx, ["load"])["failed_stage"] is None
    _perturb(ctx.state.model, layer=1)
    report = run_pipeline(ctx, ["align"])
    align = report["stages"]["align"]
    assert report["failed_stage"] == "align" and align["passed"] is False
    assert [row["passed"] for row in align["layers"]] == [True, False]
    assert align["layers"][0]["cosine"] > 0.9999 and align["layers"][1]["cosine"] < 0.99
    e2e = align["e2e"]
    assert e2e["token_match_rate"] < 1.0 and e2e["divergences"]
    first = e2e["divergences"][0]
    assert first["ref_token"] != first["target_token"]
    assert len(first["ref_top5"]) == len(first["target_top5"]) == 5
    assert first["ref_top5"][0]["token"] == first["ref_token"] and first["target_top5"][0]["token"] == first["target_token"]
    assert {"token", "text", "logprob"} <= set(first["ref_top5"][0])
    assert e2e["first_divergence"][first["prompt"]] == first["position"]
    assert "layer 1" in report["error"]


def test_a_moe_model_aligns_in_bfloat16_within_thresholds(make_ctx) -> None:
    ctx, _ = make_ctx("mixtral", dtype="bfloat16")
    report = run_pipeline(ctx, ["load", "align"])
    align = report["stages"]["align"]
    assert report["failed_stage"] is None, report["error"]
    assert all(row["cosine"] >= 0.99 for row in align["layers"])
    assert all(d["near_tie"] for d in align["e2e"]["divergences"])  # bf16 may flip only near-ties
    # layer by layer, bf16 against the fp32 reference, beside the runtime itself in fp32
    assert all(row["dtype"] == "bfloat16" and row["fp32_cosine"] > 0.99999 for row in align["layers"])
    assert all(row["cosine"] < row["fp32_cosine"] for row in align["layers"])


def test_near_tie_needs_each_token_in_the_others_top_k() -> None:
    ref = torch.tensor([5.0, 4.99, 1.0, 0.0, -1.0, -2.0, -3.0])
    close = torch.tensor([4.99, 5.0, 1.0, 0.0, -1.0, -2.0, -3.0])
    assert compare_step(ref, close, 0, 5) == (1, True)
    far = torch.tensor([-9.0, 5.0, 1.0, 0.9, 0.8, 0.7, 0.6])  # the reference's token fell out of the top 5
    assert compare_step(ref, far, 0, 5) == (1, False)
    assert compare_step(ref, ref, 0, 5) == (0, False)


def test_absent_parts_leave_align_incomplete_and_failed(make_ctx, monkeypatch) -> None:
    from agents.pipeline.stages.align.stage import PARTS

    monkeypatch.delitem(PARTS, "kv_cache")
    monkeypatch.delitem(PARTS, "ops")
    ctx, _ = make_ctx("llama")
    report = run_pipeline(ctx, ["load", "align"])
    align = report["stages"]["align"]
    assert report["failed_stage"] == "align" and align["passed"] is False and align["complete"] is False
    assert "kv_cache" not in align and "ops" not in align and align["missing"] == ["kv_cache", "ops"]
    assert "align: ops missing" in report["error"] and "align: kv_cache missing" in report["error"]
    assert report["verdicts"]["align"]["status"] == "incomplete"
    assert align["layers"] and align["e2e"]["passed"]  # what did run is kept


def test_a_complete_align_section_has_every_part(make_ctx) -> None:
    ctx, _ = make_ctx("llama")
    report = run_pipeline(ctx, ["load", "inventory", "align"])
    align = report["stages"]["align"]
    assert report["failed_stage"] is None, report["error"]
    assert align["complete"] is True and "missing" not in align and align["ops_unchecked"] == []
    assert align["ops"] and align["layers"] and align["e2e"] and align["kv_cache"]["passed"]
    # the checks follow the inventory: which traced operators the runtime's modules ran under a check
    coverage = align["inventory_coverage"]
    assert "attention prefill" in coverage["exercised"]["aten.scaled_dot_product_attention.default"]
    assert "swiglu_mlp" in coverage["exercised"]["aten.silu.default"]
    assert "aten.argmax.default" in coverage["not_exercised"]  # the trace's greedy pick is no model operator
    traced = {op["op"] for op in report["stages"]["inventory"]["ops"]}
    assert set(coverage["exercised"]) | set(coverage["not_exercised"]) == traced
    # each operator no check runs carries its reason: the portal's coverage rule asks for one
    assert set(coverage["not_exercised_reasons"]) == set(coverage["not_exercised"])
    assert all("outside every checked module" in r for r in coverage["not_exercised_reasons"].values())


def test_a_part_that_crashes_fails_align_but_keeps_the_other_evidence(make_ctx, monkeypatch) -> None:
    from agents.pipeline.stages.align.stage import PARTS

    def run(ctx):  # stands in for a KV check that hits a bug
        raise RuntimeError("block table overflow")

    monkeypatch.setitem(PARTS, "kv_cache", run)
    ctx, _ = make_ctx("llama")
    report = run_pipeline(ctx, ["load", "align"])
    align = report["stages"]["align"]
    assert report["failed_stage"] == "align" and align["passed"] is False
    assert align["layers"] and align["e2e"]["token_match_rate"] == 1.0
    assert "kv_cache check could not run (RuntimeError: block table overflow)" in report["error"]


def _e2e(ctx, **config):
    from agents.pipeline.stages.align.e2e import run_e2e
    from agents.pipeline.support.models import align_thresholds, reference_model, target_model

    ctx.config = {**ctx.config, **config}
    e2e, _ = run_e2e(ctx, target_model(ctx), reference_model(ctx), align_thresholds(ctx))
    return e2e


def test_e2e_stops_at_the_reference_end_of_sequence(make_ctx) -> None:
    ctx, _ = make_ctx("llama")
    baseline = _e2e(ctx)
    assert baseline["ref_tokens"][0] == 16 and baseline["stopped"][0] == "max_tokens"
    # make the reference's 4th generated token of prompt 0 an end-of-sequence token
    from agents.pipeline.stages.align.e2e import PROMPTS, reference_greedy
    from agents.pipeline.support.models import encode, reference_model

    prompt = encode(ctx, [PROMPTS[0]])[0][0]
    tokens, _ = reference_greedy(reference_model(ctx), prompt, 16)
    cut = next(i for i in range(3, 16) if tokens[i] not in tokens[:i])
    e2e = _e2e(ctx, eos_token_id=[tokens[cut]])
    assert e2e["ref_tokens"][0] == cut + 1 and e2e["stopped"][0] == "eos_reference"
    assert tokens[cut] in e2e["eos_token_ids"]
    assert e2e["tokens"] == sum(e2e["ref_tokens"]) and e2e["token_match_rate"] == 1.0


def test_e2e_stops_where_the_target_ends_the_sequence(make_ctx) -> None:
    ctx, _ = make_ctx("llama")
    assert run_pipeline(ctx, ["load"])["failed_stage"] is None
    _perturb(ctx.state.model, layer=1)
    baseline = _e2e(ctx)
    first = baseline["divergences"][0]
    p, pos = first["prompt"], first["position"]
    e2e = _e2e(ctx, eos_token_id=[first["target_token"]])  # the target now ends the sequence there
    assert e2e["stopped"][p] == "eos_target"
    assert max(d["position"] for d in e2e["divergences"] if d["prompt"] == p) == pos  # nothing compared past it
    assert e2e["tokens"] < baseline["tokens"]
