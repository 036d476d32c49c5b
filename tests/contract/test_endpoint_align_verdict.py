"""The align verdict of an external engine: endpoint align (e2e + the KV self-consistency check) replaces
operator and layer align; every KL is recomputed from the rows; a no-op control that reads a difference, a
perturbed prompt that is not seen, a hit that differs, or a claimed KL its rows do not give all fail, naming the
check; endpoint align on the bundled runtime, or another form of align on an external engine, is incomplete."""

from __future__ import annotations

import pytest

from contract import tiers, verdicts
from contract.endpoint_align import row_kl, topk_kl
from tests.endpoint_sections import endpoint_align
from tests.portal.reports import passing

VLLM = verdicts.Context(engine="vllm")


def _judge(section, context=VLLM):
    return verdicts.judge("align", section, None, context)


def test_an_honest_endpoint_section_passes_on_an_external_engine_and_gates_tier_4():
    verdict = _judge(endpoint_align())
    assert verdict.status == "pass", verdict.reasons
    assert any("operator and layer align are not applicable" in n for n in verdict.notes)
    stages = {"plan": True, "load": True, "serve": True, "align": verdict.passed}
    assert tiers.compute_tier(stages) == 4


@pytest.mark.parametrize(("section", "reason"), [
    (endpoint_align(hit=1.5), "align: kv_self hit: mean top-k KL"),
    (endpoint_align(noop_differs=True), "align: kv_self no-op control"),
    (endpoint_align(perturbed=0.0), "align: kv_self perturbed prompt: mean KL"),
])
def test_a_kv_fault_or_a_blind_control_fails_naming_the_check(section, reason):
    verdict = _judge(section)
    assert verdict.status == "fail" and any(r.startswith(reason) for r in verdict.reasons), verdict.reasons


def test_a_claimed_kl_its_rows_do_not_give_fails():
    section = endpoint_align(hit=1.5)
    hit = next(r for r in section["kv_self"]["rows"] if r["case"] == "hit")
    hit["mean_kl"] = 0.0  # a hit that differs, claimed identical
    verdict = _judge(section)
    assert any("kv_self hit: claimed mean KL 0, recomputed" in r for r in verdict.reasons), verdict.reasons


@pytest.mark.parametrize(("drop", "reason"), [
    ("kv_self", "kv_self missing"),
    ("e2e", "e2e missing"),
])
def test_an_endpoint_section_without_a_part_is_incomplete(drop, reason):
    section = endpoint_align()
    del section[drop]
    verdict = _judge(section)
    assert verdict.status == "incomplete" and any(reason in r for r in verdict.reasons), verdict.reasons


def test_a_missing_case_row_is_incomplete():
    section = endpoint_align()
    section["kv_self"]["rows"] = [r for r in section["kv_self"]["rows"] if r["case"] != "perturbed"]
    verdict = _judge(section)
    assert verdict.status == "incomplete" and any("no perturbed row" in r for r in verdict.reasons)


@pytest.mark.parametrize("engine", [None, "day0"])
def test_endpoint_align_claimed_for_the_bundled_runtime_gains_nothing(engine):
    verdict = _judge(endpoint_align(), verdicts.Context(engine=engine))
    assert verdict.status == "incomplete"
    assert any("is an external engine's align" in r for r in verdict.reasons), verdict.reasons


def test_an_external_engines_align_of_the_bundled_form_is_incomplete():
    verdict = _judge(passing("align"))  # ops and layers an external engine cannot have measured
    assert verdict.status == "incomplete"
    assert any("an external engine (vllm) is aligned through its endpoint" in r for r in verdict.reasons)


def test_a_portal_challenge_judges_the_e2e_part_of_an_endpoint_section():
    calls = []
    context = verdicts.Context(engine="vllm", challenge=lambda v, stage, s, t: calls.append(stage) or v.missing(
        "e2e: raw outputs missing (the answers to the attempt's challenge)"))
    verdict = _judge(endpoint_align(), context)
    assert calls == ["align"] and verdict.status == "incomplete"


def test_topk_kl_is_zero_on_equal_lists_and_grows_with_a_shift():
    a = [{"token": 1, "logprob": -0.1}, {"token": 2, "logprob": -2.5}]
    assert topk_kl(a, a) == 0.0
    assert topk_kl(a, [{"token": 1, "logprob": -1.0}, {"token": 2, "logprob": -0.5}]) > 0.5
    # a token missing from the other side's list gets that side's smallest listed logprob
    assert topk_kl(a, [{"token": 1, "logprob": -0.1}, {"token": 3, "logprob": -2.5}]) == pytest.approx(0.0)
    assert topk_kl(a, [{"token": 1, "logprob": 0.5}]) is None  # a logprob above 0 is no logprob
    assert row_kl([a], [a, a]) is None  # different lengths
