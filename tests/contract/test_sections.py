"""The stage report's section schemas (``contract.sections``): the keys and types of each stage's section, and
the one promise both sides keep: the pipeline (before it posts) and the portal (when it ingests, over REST)
refuse the same malformed section with the same sentence naming the same path."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ValidationError

from contract import sections
from contract.sections import section_problems, type_problems
from contract.tiers import STAGE_ORDER
from tests.factories import HardwareFactory, JobFactory, OrganizationFactory, auth, make_token
from tests.portal.reports import PASSING, bound

MALFORMED: list[tuple[str, dict[str, Any], str, str]] = [
    ("plan", {**PASSING["plan"], "fits": "sure"}, "stages.plan.fits", "must be true or false, got str"),
    ("plan", {**PASSING["plan"], "plan": {"tp": "two", "pp": 1, "ep": 1, "devices": 1}}, "stages.plan.plan.tp",
     "must be an integer, got str"),
    ("load", {**PASSING["load"], "seconds": "fast"}, "stages.load.seconds", "must be a number, got str"),
    ("load", {**PASSING["load"], "shards": {"a": 1}}, "stages.load.shards", "must be a list"),
    ("load", {**PASSING["load"], "problems": ["nan"]}, "stages.load.problems[0]", "must be an object"),
    ("align", {**PASSING["align"], "layers": [{"layer": 1.5, "cosine": 1.0, "max_rel_err": 0.0, "passed": True}]},
     "stages.align.layers[0].layer", "must be an integer, got float"),
    ("serve", {"ready_seconds": 1.0, "endpoint": ["x"], "text_path_ok": True}, "stages.serve.endpoint",
     "must be a string, got list"),
    ("bench", {"runs": [{"concurrency": "many"}]}, "stages.bench.runs[0].concurrency", "must be an integer, got str"),
    ("env", {**PASSING["env"], "device_count": True}, "stages.env.device_count", "must be an integer, got bool"),
]


def test_every_stage_but_the_reference_has_types_and_every_stage_keys() -> None:
    assert set(sections.SECTION_KEYS) == set(STAGE_ORDER) - {"soak"}
    assert set(sections.SECTION_TYPES) == set(STAGE_ORDER) - {"reference"}  # the reference has its own parser
    untyped = {(stage, key) for stage, keys in sections.SECTION_KEYS.items() if stage != "reference"
               for key in keys if key not in sections.SECTION_TYPES[stage]}
    # bench's runs: the portal's own sentence names the list it wants; inventory's summary: stored as written
    assert untyped == {("bench", "runs"), ("inventory", "summary")}


def test_type_problems_name_each_bad_value_by_path_and_take_null_as_not_measured() -> None:
    section = {"ok": None, "tensors": 3.0, "bytes": "9", "seconds": 1, "shards": [{"file": 7, "sha256": None}, 4]}
    assert type_problems("load", section) == [("stages.load.bytes", "must be an integer, got str"),
                                              ("stages.load.shards[1]", "must be an object")]
    assert type_problems("load", {"shards": "x"}, "load") == [("load.shards", "must be a list")]  # not its rows
    assert type_problems("align", {"e2e": {"divergences": [{"prompt": 0, "near_tie": "no"}]}}) == [
        ("stages.align.e2e.divergences[0].near_tie", "must be true or false, got str")]
    assert type_problems("bench", {"runs": "x"}) == []  # the portal names the list it wants
    assert all(type_problems(stage, PASSING[stage]) == [] for stage in PASSING)


def test_section_problems_name_missing_keys_by_path() -> None:
    section = {"passed": True, "thresholds": {}, "layers": [{"layer": 0, "cosine": 1.0, "passed": True}],
               "e2e": {"prompts": 1, "tokens": 4, "token_match_rate": 1.0, "divergences": [{"prompt": 0}],
                       "perplexity_ref": 1.0}}
    problems = section_problems("align", section)
    assert "align.layers[0].max_rel_err" in problems
    assert "align.e2e.perplexity_target" in problems
    assert "align.e2e.divergences[0].near_tie" in problems
    assert section_problems("serve", {"ready_seconds": 1, "endpoint": "x", "text_path_ok": True}) == []


def test_section_problems_name_missing_keys_and_skip_rows_that_are_not_objects() -> None:
    assert section_problems("load", {**PASSING["load"], "shards": ["x", {"file": "a"}]}) == ["load.shards[1].sha256"]
    assert section_problems("comm", {"ranks": 2}) == ["comm.collectives"]


@pytest.fixture
def make_ctx():
    from agents.pipeline.support.context import StageContext
    from contract.hardware import get_hardware

    def build(emitted: list[dict[str, Any]]) -> StageContext:
        return StageContext(model_dir=None, config={"architectures": ["LlamaForCausalLM"]},
                            hardware=get_hardware("cpu").to_dict(),
                            emit_fn=lambda kind, message, **kw: emitted.append({"kind": kind, **kw}))

    return build


@pytest.mark.django_db
@pytest.mark.parametrize(("stage", "section", "path", "message"), MALFORMED)
def test_the_pipeline_and_the_portal_refuse_the_same_malformed_section_with_the_same_sentence(
        stage, section, path, message, make_ctx, monkeypatch, api_client) -> None:
    from agents.pipeline.registry import STAGES
    from agents.pipeline.runner import run_stage
    from apps.evidence.models import StageResult
    from apps.evidence.services import parse_stage_section

    monkeypatch.setitem(STAGES, stage, lambda ctx: dict(section))
    emitted: list[dict[str, Any]] = []
    report: dict[str, Any] = {"stages": {}, "verdicts": {}, "seconds": {}}
    error = run_stage(make_ctx(emitted), stage, report)
    assert error == f"stage {stage!r} returned a malformed section: {path}: {message}"
    assert stage not in report["stages"] and not [e for e in emitted if e["kind"] == "result"]  # nothing to post

    with pytest.raises(ValidationError) as refused:
        parse_stage_section(stage, section)
    assert refused.value.message_dict == {path: [message]}

    hardware = HardwareFactory()
    job = JobFactory(hardware=hardware)
    token = make_token(organization=OrganizationFactory(), scopes=["agent"], hardware=hardware)
    answer = api_client.post(f"/api/v1/jobs/{job.pk}/results/", bound(job, {"stage": stage, "section": section}),
                             format="json", **auth(token))
    assert answer.status_code == 400 and answer.json() == {path: [message]}, answer.content
    assert not StageResult.objects.exists()
