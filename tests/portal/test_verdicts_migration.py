"""The data migrations that re-judge evidence stored before verdicts existed: the agent's old flag becomes a
claim, the portal's verdict decides, and cells take their tiers from it (nothing stored is lost). They judge
with the rules frozen beside them (``_frozen_0004``), not with today's."""

from __future__ import annotations

import importlib

import pytest
from django.apps import apps

from apps.evidence.models import StageResult
from apps.matrix.models import Cell
from tests.factories import JobFactory
from tests.portal.reports import passing

pytestmark = pytest.mark.django_db
rejudge = importlib.import_module("apps.evidence.migrations.0004_rejudge_stored_results").rejudge
recompute = importlib.import_module("apps.matrix.migrations.0004_cells_from_verdicts").recompute


def test_legacy_flags_become_claims_and_cells_follow_the_verdicts() -> None:
    job = JobFactory()
    serve = {"text_path_ok": True, "checks": [{"name": "chat", "ok": False}]}
    legacy = {"plan": passing("plan"), "load": passing("load"), "serve": serve}
    for stage, section in legacy.items():  # as stored before verdicts: passed was the agent's flag
        StageResult.objects.create(job=job, stage=stage, passed=True, section=section)
    Cell.objects.filter(model=job.model, hardware=job.hardware).update(tier=3, tier_reached_at={
        "1": "2026-01-01T00:00:00+00:00", "2": "2026-01-01T02:00:00+00:00", "3": "2026-01-01T01:00:00+00:00"})
    rejudge(apps, None)
    rows = {r.stage: r for r in StageResult.objects.filter(job=job)}
    assert {s: r.verdict for s, r in rows.items()} == {"plan": "pass", "load": "pass", "serve": "fail"}
    assert rows["serve"].claimed_passed is True and rows["serve"].passed is False
    assert rows["serve"].reasons == ["serve: checks failed: chat"]
    assert rows["serve"].defaults_version == "2026.12.1"  # the defaults 0004 judged with
    recompute(apps, None)
    cell = Cell.objects.get(model=job.model, hardware=job.hardware)
    assert cell.tier == 2 and cell.disputed == ["serve"]
    assert cell.tier_reached_at["3"] == "2026-01-01T02:00:00+00:00"  # kept, made monotone (as 0004 did)
    assert StageResult.objects.filter(job=job).count() == 3  # nothing lost


def test_the_migrations_judge_with_their_frozen_rules_not_todays() -> None:
    """A serve section that today's rules find incomplete (never shown ready) passed the rules 0004 applied."""
    from contract import verdicts

    section = {"text_path_ok": True}
    assert verdicts.judge("serve", section).status == "incomplete"
    job = JobFactory()
    StageResult.objects.create(job=job, stage="serve", passed=True, section=section)
    rejudge(apps, None)
    assert StageResult.objects.get(job=job, stage="serve").verdict == "pass"
