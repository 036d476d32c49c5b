"""The conformance verdict recomputes every row from its target and reference: a section passes only when its
rows show it, a forged pass (rows claiming ``passed`` over numbers that fail) is refused naming the check, a
missing check is incomplete, and tier 3 needs conformance where the model's template declares tools."""

from __future__ import annotations

import copy

import pytest

from contract import sections, thresholds, tiers, verdicts
from contract.conformance import ALL_CHECKS, declares_tools, required_checks
from contract.verdicts.base import Context, ModelFacts

MSG = {"content": "", "reasoning_content": "", "tool_calls": [{"name": "get_time", "arguments": {}}],
       "finish_reason": "tool_calls"}
ROWS = {
    "tool_trigger_agreement": ([True, False, True, True], [True, False, True, True]),
    "tool_arguments_valid": ({"valid": 3, "calls": 3}, {"valid": 3, "calls": 3}),
    "forced_calls_valid": ({"valid": 4, "requests": 4}, {"valid": 4, "requests": 4}),
    "json_schema_valid": ({"valid": 3, "requests": 3}, {"valid": 3, "requests": 3}),
    "stream_equals_whole": ([{"whole": MSG, "streamed": MSG}] * 4, None),
    "prompt_tokens": ([462, 457], [462, 457]),
    "stop_honoured": (["The moon is "], ["The moon is "]),
    "n_honoured": (2, 2),
    "seed_determinism": (["abc", "abc"], 1234),
    "max_tokens_honoured": ([1, 5], [1, 5]),
    "error_shape": ([{"case": "no messages", "status": 400, "error_keys": ["message", "param", "type"]}],
                    {"status": 400, "error_keys": ["message", "type"]}),
    "reasoning_not_in_content": ({"leaks": 0, "responses": 4}, {"leaks": 0}),
}


def section(**changes) -> dict:
    rows = [{"check": c, "passed": True, "detail": "", "target": copy.deepcopy(t), "reference": copy.deepcopy(r)}
            for c, (t, r) in ROWS.items()]
    out = {"template_declares_tools": True, "thinking": True, "repeats": 1, "checks": rows, "passed": True}
    for check, target in changes.items():
        next(r for r in rows if r["check"] == check)["target"] = target
    return out


def test_a_section_whose_rows_show_every_check_passing_passes():
    assert set(ROWS) == set(ALL_CHECKS)
    v = verdicts.judge("conformance", section())
    assert v.passed, v.reasons
    assert not sections.section_problems("conformance", section())
    assert not sections.type_problems("conformance", section())


@pytest.mark.parametrize(("check", "target", "says"), [
    ("tool_trigger_agreement", [True, True, True, True], "trigger agreement 0.750"),
    ("tool_arguments_valid", {"valid": 2, "calls": 3}, "2 of 3 unforced calls valid"),
    ("forced_calls_valid", {"valid": 3, "requests": 4}, "3 of 4 forced-call requests valid"),
    ("json_schema_valid", {"valid": 2, "requests": 3}, "2 of 3 json_schema answers valid"),
    ("stream_equals_whole", [{"whole": MSG, "streamed": {**MSG, "tool_calls": []}}], "streamed differs"),
    ("prompt_tokens", [463, 457], "prompt token counts differ at [0]"),
    ("stop_honoured", ["The moon is bright"], "texts cut at the stop sequence differ"),
    ("n_honoured", 1, "1 choices returned for n=2"),
    ("seed_determinism", ["abc", "abd"], "2 different texts"),
    ("max_tokens_honoured", [2, 5], "completion tokens above max_tokens"),
    ("error_shape", [{"case": "no messages", "status": 500, "error_keys": []}], "not a 400"),
    ("reasoning_not_in_content", {"leaks": 1, "responses": 4}, "reasoning in content in 1 of 4"),
])
def test_a_forged_pass_is_refused_naming_the_check(check, target, says):
    """Every row still claims ``passed: true`` and the section ``passed: true``: the numbers decide."""
    v = verdicts.judge("conformance", section(**{check: target}))
    assert v.status == verdicts.FAIL
    assert any(r.startswith(f"conformance: {check}: ") and says in r for r in v.reasons), v.reasons


def test_a_missing_check_or_malformed_rows_are_incomplete_or_failing():
    s = section()
    s["checks"] = [r for r in s["checks"] if r["check"] != "forced_calls_valid"]
    v = verdicts.judge("conformance", s)
    assert v.status == verdicts.INCOMPLETE and "conformance: check forced_calls_valid missing" in v.reasons
    assert verdicts.judge("conformance", {**section(), "checks": []}).status == verdicts.INCOMPLETE
    v = verdicts.judge("conformance", section(prompt_tokens="462"))
    assert v.status == verdicts.FAIL and "prompt token counts" in " ".join(v.reasons)
    s = section()
    s["checks"].append(dict(s["checks"][0]))
    assert "reported twice" in " ".join(verdicts.judge("conformance", s).reasons)


def test_tool_checks_cannot_be_dropped_by_saying_the_template_declares_none():
    s = section()
    s["template_declares_tools"] = False
    s["checks"] = [r for r in s["checks"] if not r["check"].startswith(("tool_", "forced_"))]
    assert verdicts.judge("conformance", s).passed  # no portal fact: the section's own word
    portal = Context(model=ModelFacts(template_declares_tools=True))
    v = verdicts.judge("conformance", s, context=portal)
    assert not v.passed and "check tool_trigger_agreement missing" in " ".join(v.reasons)
    assert "the section says it does not" in " ".join(v.reasons)
    assert "tool_trigger_agreement" not in required_checks(False, False)


def test_thresholds_are_read_from_the_versioned_table():
    s = section(tool_trigger_agreement=[True, True, True, True])  # 0.75
    assert not verdicts.judge("conformance", s).passed
    assert verdicts.judge("conformance", s, {"conformance_min_trigger_agreement": 0.7}).passed
    assert thresholds.TABLE["conformance_min_trigger_agreement"].default == 0.98
    v = verdicts.judge("conformance", section(), {"conformance_repeats": 10})
    assert not v.passed and "sent 1 time(s), the job asks 10" in " ".join(v.reasons)
    with pytest.raises(ValueError, match="conformance_min_forced_valid"):
        thresholds.check_thresholds({"conformance_min_forced_valid": 1.5})


def test_declares_tools_reads_the_template_text():
    assert declares_tools("{% if tools %}<tools>{{ tools | tojson }}</tools>{% endif %}")
    assert declares_tools("{%- for t in tools -%}{{ t }}{%- endfor -%}")
    assert not declares_tools("{{ messages[0].content }} tools are nice")
    assert not declares_tools(None)


def test_tier_three_needs_conformance_where_the_template_declares_tools():
    passed = {"plan": True, "load": True, "serve": True, "align": True}
    assert tiers.compute_tier(passed) == 4
    assert tiers.compute_tier(passed, template_declares_tools=True) == 2
    assert tiers.compute_tier({**passed, "conformance": True}, template_declares_tools=True) == 4
    assert tiers.compute_tier({**passed, "conformance": False}, template_declares_tools=True) == 2
    assert tiers.declares_tools({"serve": {"template_declares_tools": True}})
    assert not tiers.declares_tools({"serve": {"template_declares_tools": True}}, known=False)
    assert tiers.with_conformance(["plan", "serve", "bench"], True) == ["plan", "serve", "conformance", "bench"]
    assert tiers.with_conformance(["plan", "serve", "bench"], False) == ["plan", "serve", "bench"]
    assert tiers.with_conformance(["plan", "load"], True) == ["plan", "load"]
