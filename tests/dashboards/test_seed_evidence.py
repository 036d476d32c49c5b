"""``manage.py seed_evidence``: evidence through the portal's services, with historic times and a planted
regression that the detector finds."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from apps.accounts.access import ANONYMOUS
from apps.benchmarks.selectors import SeriesQuery, load_series
from apps.jobs.models import Job
from apps.matrix.models import Cell
from tests.factories import HardwareFactory, ModelReleaseFactory

pytestmark = pytest.mark.django_db


def test_refuses_an_empty_catalog():
    with pytest.raises(CommandError, match="the catalog is empty: run `manage.py seed` first"):
        call_command("seed_evidence", "--days", "5")


def test_seeds_jobs_lead_times_history_and_a_detectable_regression():
    from datetime import UTC, datetime, timedelta

    model = ModelReleaseFactory(slug="seed-me-1b", released_at=datetime.now(UTC) - timedelta(days=90))
    HardwareFactory(slug="seed-a"), HardwareFactory(slug="seed-b")
    out = StringIO()
    call_command("seed_evidence", "--days", "40", "--history-cells", "1", "--hardware-per-model", "2",
                 "--seed", "1", stdout=out)
    text = out.getvalue()
    assert "history: seed-me-1b ×" in text and "40 daily runs" in text
    assert "planted regression: seed-me-1b ×" in text
    assert Job.objects.filter(spec__seeded=True).count() >= 41
    cells = Cell.objects.filter(model=model).exclude(tier_reached_at={})
    assert cells.exists()
    for cell in cells:  # tiers were reached hours after the release, not at seeding time
        first = min(datetime.fromisoformat(t) for t in cell.tier_reached_at.values())
        assert timedelta(0) < first - model.released_at < timedelta(days=10)
    series = load_series(ANONYMOUS, SeriesQuery(model=model.slug, metrics=("ttft_ms_p50",)))
    flagged = {r.at.date() for s in series for r in s.regressions}
    planted = text.split("planted regression: ")[1].split(" at ")[1][:10]
    assert planted in {d.isoformat() for d in flagged}

    with pytest.raises(CommandError, match="use --reset"):
        call_command("seed_evidence", "--days", "5")
    call_command("seed_evidence", "--days", "3", "--reset", "--history-cells", "1", stdout=StringIO())
    assert Job.objects.filter(spec__seeded=True).count() < 41


@pytest.mark.parametrize("hour", [0, *(pytest.param(h, marks=pytest.mark.slow) for h in (1, 3, 23))])
def test_the_history_has_as_many_daily_runs_as_days_at_any_hour_of_seeding(hour):
    """The daily runs start at 02:00: seeded before 02:00 the first run is the day before, not one day lost."""
    from datetime import UTC, datetime, timedelta

    from apps.benchmarks.seeding import seed_evidence

    now = datetime(2026, 12, 2, hour, 30, tzinfo=UTC)
    ModelReleaseFactory(slug="seed-hour-1b", released_at=now - timedelta(days=90))
    HardwareFactory(slug="seed-h")
    summary = seed_evidence(days=20, history_cells=1, hardware_per_model=1, seed=1, now=now,
                            outcomes=["baselined"])
    assert [runs for _m, _h, runs in summary.history] == [20]
