"""The portal's side of the conformance stage: a section is stored and judged from its rows (a forged pass is
refused naming the check), a malformed one is refused naming the path and stores nothing, the cell page shows a
row per check with the reference beside the target, the cell API exposes the rows, and tier 3 needs a passing
conformance where the serve section found that the model's template declares tools."""

from __future__ import annotations

import re

import pytest
from django.core.exceptions import ValidationError

from apps.evidence.ingest import do_record_job_results
from apps.evidence.models import StageResult
from apps.evidence.services import do_record_stage_results
from apps.jobs.choices import JobPurpose
from apps.matrix.models import Cell
from tests.contract.test_conformance_verdict import section
from tests.factories import HardwareFactory, JobFactory
from tests.portal.challenges import answered
from tests.portal.reports import TIER_STAGES, bound, passing

pytestmark = pytest.mark.django_db


def _job():
    return JobFactory(spec={"stages": ["serve", "conformance"], "dtype": "bfloat16"})


def test_a_section_is_judged_from_its_rows_and_a_forged_pass_is_refused() -> None:
    [ok] = do_record_stage_results(_job(), {"conformance": section()})
    assert ok.verdict == "pass" and ok.claimed_passed is True
    [forged] = do_record_stage_results(_job(), {"conformance": section(prompt_tokens=[463, 457])})
    assert forged.verdict == "fail" and forged.disputed
    assert any(r.startswith("conformance: prompt_tokens:") for r in forged.reasons), forged.reasons


def test_a_malformed_section_is_refused_naming_the_path() -> None:
    rows = section()["checks"]
    for bad, where in (({"checks": "x"}, "stages.conformance.checks"),
                       ({"checks": [*rows[:1], {**rows[1], "check": "vibes"}]}, "stages.conformance.checks[1].check"),
                       ({"checks": [{**rows[0], "target": ["x" * 70_000]}]}, "stages.conformance.checks[0]"),
                       ({"repeats": 0}, "stages.conformance")):
        with pytest.raises(ValidationError) as err:
            do_record_stage_results(_job(), {"conformance": {**section(), **bad}})
        assert where in str(err.value), err.value
    assert StageResult.objects.count() == 0


def test_the_cell_page_and_api_show_a_row_per_check_target_beside_reference(client) -> None:
    job = _job()
    forged = section(stream_equals_whole=[{"whole": {"a": 1}, "streamed": {}}])
    do_record_job_results(job, bound(job, {"stages": {"conformance": forged}}))
    page = client.get(f"/cells/{job.model.slug}/{job.hardware.slug}/").content.decode()
    card = re.search(r'<section class="card" id="conformance".*?</section>', page, re.S).group(0)
    assert card.count("<tr data-check=") == 12
    row = re.search(r'<tr data-check="stream_equals_whole" class="failed">.*?</tr>', card, re.S).group(0)
    assert "✗ fail" in row and "claimed pass" in row and "streamed differs" in row
    row = re.search(r'<tr data-check="prompt_tokens">.*?</tr>', card, re.S).group(0)
    assert row.count("[462, 457]") == 2 and "✓ pass" in row
    api = client.get(f"/api/v1/cells/{job.model.slug}/{job.hardware.slug}/").json()
    rows = {r["check"]: r for r in api["conformance"]["rows"]}
    assert rows["stream_equals_whole"]["passed"] is False and rows["stream_equals_whole"]["claimed"] is True
    assert rows["tool_trigger_agreement"]["target"] == "[true, false, true, true]"
    assert api["verdicts"]["conformance"]["status"] == "fail"


def test_tier_three_waits_on_conformance_where_the_template_declares_tools() -> None:
    job = JobFactory()
    model, hardware = job.model, job.hardware
    sections = {s: passing(s) for s in TIER_STAGES[4]}
    sections["serve"]["template_declares_tools"] = True
    do_record_job_results(job, bound(job, {"stages": answered(job, sections)}))
    cell = Cell.objects.get(model=model, hardware=hardware)
    assert cell.tier == 2
    job = JobFactory(model=model, hardware=hardware, spec={"stages": ["conformance"], "dtype": "bfloat16"})
    do_record_job_results(job, bound(job, {"stages": {"conformance": section(n_honoured=1)}}))
    cell.refresh_from_db()
    assert cell.tier == 2 and cell.failed_stage == "conformance" and "n_honoured" in cell.error
    job = JobFactory(model=model, hardware=hardware, spec={"stages": ["conformance"], "dtype": "bfloat16"})
    do_record_job_results(job, bound(job, {"stages": {"conformance": section()}}))
    cell.refresh_from_db()
    assert cell.tier == 4


def test_the_reference_runs_word_on_tools_outweighs_a_vendor_section_that_omits_it() -> None:
    job = JobFactory()
    model, hardware = job.model, job.hardware
    reference = JobFactory(model=model, hardware=HardwareFactory(reference=True), purpose=JobPurpose.REFERENCE,
                           spec={"stages": ["serve"], "dtype": "bfloat16"})
    do_record_stage_results(reference, {"serve": {**passing("serve"), "template_declares_tools": True}})
    sections = {s: passing(s) for s in TIER_STAGES[4]}
    sections["serve"]["template_declares_tools"] = False  # the vendor's word
    do_record_job_results(job, bound(job, {"stages": answered(job, sections)}))
    assert Cell.objects.get(model=model, hardware=hardware).tier == 2
    tools_dropped = section()
    tools_dropped["template_declares_tools"] = False
    tools_dropped["checks"] = [r for r in tools_dropped["checks"] if not r["check"].startswith(("tool_", "forced_"))]
    job = JobFactory(model=model, hardware=hardware, spec={"stages": ["conformance"], "dtype": "bfloat16"})
    [result] = do_record_job_results(job, bound(job, {"stages": {"conformance": tools_dropped}}))
    assert result.verdict == "incomplete" and "the portal's fact" in " ".join(result.reasons)
    assert Cell.objects.get(model=model, hardware=hardware).tier == 2
