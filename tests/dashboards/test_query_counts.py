"""The dashboard pages cost a fixed number of queries whatever the history: more runs, jobs and events add
rows, never queries."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.benchmarks.seeding import run_adaptation, run_benchmark_history, simulated_clock
from tests.factories import HardwareFactory, ModelReleaseFactory

pytestmark = pytest.mark.django_db
START = datetime(2026, 1, 1, tzinfo=UTC)


def count_queries(client, url: str) -> int:
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(url)
    assert response.status_code == 200, (url, response.content[:500])
    return len(ctx.captured_queries)


def test_page_query_counts_do_not_grow_with_runs_jobs_or_events(client):
    model = ModelReleaseFactory(slug="qc-model", released_at=START - timedelta(days=1))
    hw, other = HardwareFactory(slug="qc-hw"), HardwareFactory(slug="qc-other")
    rng = random.Random(0)
    with simulated_clock(START) as clock:
        job = run_adaptation(model, hw, "validated", clock, rng)
        failed = run_adaptation(model, other, "align-fails", clock, rng)
        run_benchmark_history(model, hw, clock, rng, start=START + timedelta(days=2), days=3)
    urls = [f"/cells/{model.slug}/{hw.slug}/", f"/trends/?model={model.slug}&hardware={hw.slug}",
            f"/jobs/{job.pk}/", "/day0/", f"/badges/{model.slug}/{hw.slug}.svg", "/export/matrix.csv",
            f"/api/v1/benchmarks/?model={model.slug}&hardware={hw.slug}", "/api/v1/benchmarks/regressions/",
            f"/api/v1/cells/{model.slug}/{hw.slug}/", "/", "/jobs/", f"/jobs/?model={model.slug}&state=succeeded",
            f"/models/{model.slug}/", "/hardware/", f"/hardware/{hw.slug}/", "/agents/", "/regressions/",
            f"/regressions/?model={model.slug}&open=1", f"/compare/?a={failed.pk}&b={job.pk}", "/?dtype=int4"]
    before = {url: count_queries(client, url) for url in urls}
    with simulated_clock(START) as clock:
        run_benchmark_history(model, hw, clock, rng, start=START + timedelta(days=10), days=25)
        run_adaptation(model, hw, "baselined", clock, rng)  # another full job with events
        run_benchmark_history(model, other, clock, rng, start=START + timedelta(days=40), days=5)
    after = {url: count_queries(client, url) for url in urls}
    assert after == before
    # the cell page: session-free reads of model, hardware, cell, newest results, checklist, alignment rows,
    # benchmark points, load rows, the job page (count, rows, the one before), open regressions (history stamp,
    # runs, points), agents online; the stack line (newest result, newest env lock, the stack change after it)
    # and the soak card (its newest result); the cell's tier history; each hardware's digests while the
    # release has no manifest (one query: a disagreement between hardware is shown); the default engine and every
    # engine's cell of the model × hardware (two); the portal-scored code and agent rows (the challenge's scores)
    assert before[f"/cells/{model.slug}/{hw.slug}/"] <= 32
    assert before[f"/trends/?model={model.slug}&hardware={hw.slug}"] <= 8
    assert before[f"/jobs/{job.pk}/"] <= 8
