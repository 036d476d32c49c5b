"""The matrix page and API: content, filters, and a query count that does not grow with the data."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.evidence.ingest import do_record_job_results
from tests.factories import HardwareFactory, JobFactory, ModelReleaseFactory, UserFactory
from tests.portal.bulk import build_matrix
from tests.portal.reports import TIER_STAGES, bound, passing

pytestmark = pytest.mark.django_db


def test_the_page_shows_tier_label_colour_fits_and_lead_time(client) -> None:
    model = ModelReleaseFactory(slug="tiny-1.1b")
    hardware = HardwareFactory(slug="npu-x", vendor="Acme")
    job = JobFactory(model=model, hardware=hardware)
    do_record_job_results(job, bound(job, {"stages": {s: passing(s) for s in TIER_STAGES[3]}}))
    html = client.get("/").content.decode()
    assert 'class="cell tier-3"' in html and "T3 serves" in html
    # the tooltip: each tier's date and signed lead time, and the fit with its format (the hardware's name)
    assert "T3 serves: " in html and " from release)" in html and f"fits on 1 × {hardware.name} in bfloat16" in html
    assert 'href="/cells/tiny-1.1b/npu-x/"' in html
    # usable without JavaScript: the cells are in the HTML; the scripts only filter as you type and go live
    assert html.count("<script") == 3 and '<script src="/static/js/matrix_live.js" defer>' in html
    cell_page = client.get("/cells/tiny-1.1b/npu-x/")
    assert cell_page.status_code == 200 and model.name in cell_page.content.decode()


def test_rows_are_newest_release_first_and_filters_apply(client, api_client) -> None:
    from datetime import UTC, datetime

    old = ModelReleaseFactory(slug="old-1b", released_at=datetime(2023, 1, 1, tzinfo=UTC))
    new = ModelReleaseFactory(slug="new-1b", released_at=datetime(2025, 6, 1, tzinfo=UTC))
    qwen = ModelReleaseFactory(slug="qwen-ish", config={**new.config, "architectures": ["Qwen3ForCausalLM"],
                                                        "model_type": "qwen3", "head_dim": 64},
                               released_at=datetime(2024, 1, 1, tzinfo=UTC))
    a, b = HardwareFactory(vendor="Acme"), HardwareFactory(vendor="Beta")
    job = JobFactory(model=old, hardware=a)
    do_record_job_results(job, bound(job, {"stages": {s: passing(s) for s in TIER_STAGES[2]}}))
    data = api_client.get("/api/v1/matrix/").json()
    assert [r["slug"] for r in data["models"]] == ["new-1b", "qwen-ish", "old-1b"]
    assert set(data["models"][0]["cells"]) == {a.slug, b.slug}
    assert [h["slug"] for h in api_client.get("/api/v1/matrix/?vendor=Beta").json()["hardware"]] == [b.slug]
    assert [r["slug"] for r in api_client.get("/api/v1/matrix/?family=qwen3").json()["models"]] == [qwen.slug]
    assert [r["slug"] for r in api_client.get("/api/v1/matrix/?tier=2").json()["models"]] == ["old-1b"]
    assert [r["slug"] for r in api_client.get("/api/v1/matrix/?tier=loads").json()["models"]] == ["old-1b"]
    assert api_client.get("/api/v1/matrix/?tier=9").status_code == 400
    page = client.get("/?vendor=Beta&tier=2").content.decode()
    assert "No models match" in page
    page = client.get("/?family=qwen3").content.decode()
    assert "qwen-ish" in page and "old-1b" not in page


def _count(client, url: str) -> int:
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(url).status_code == 200
    return len(ctx.captured_queries)


@pytest.mark.parametrize("url", ["/", "/api/v1/matrix/"])
def test_query_count_does_not_grow_with_models_hardware_or_jobs(client, url: str) -> None:
    user = UserFactory()
    client.force_login(user)
    build_matrix(3, 2, 1, tag="s")
    small, small_hit = _count(client, url), _count(client, url)
    build_matrix(30, 12, 4, tag="l")  # a change: the cached render is stale
    large, large_hit = _count(client, url), _count(client, url)
    assert (small, small_hit) == (large, large_hit), (small, small_hit, large, large_hit)
    # session, user, memberships; hardware, models, cells, filter choices, the next embargo's end; open
    # regressions (3); a cached render: only the session, the viewer and its regression flags
    assert large <= 12 and large_hit < large


def test_query_count_is_fixed_for_anonymous_readers(client, django_assert_num_queries) -> None:
    build_matrix(5, 3, 2, tag="a")
    with django_assert_num_queries(5):  # hardware, models, row versions, the new rows' cells, the next embargo's end
        client.get("/api/v1/matrix/")
    with django_assert_num_queries(0):  # cached until a cell, a model or a hardware changes
        client.get("/api/v1/matrix/")
    with django_assert_num_queries(8):  # + the vendor, family and engine filter choices, the benchmark history stamp
        client.get("/")
    with django_assert_num_queries(1):  # cached: the benchmark history stamp (the viewer's regression flags)
        client.get("/")
