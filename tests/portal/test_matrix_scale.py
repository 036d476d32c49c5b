"""The matrix at scale: one page of rows with every model reachable, search and filters over all rows, the
rendered grid and the API's JSON cached per viewer scope and invalidated by a cell change, never one viewer's
private rows served to another, and queries that do not grow with the rows."""

from __future__ import annotations

import csv
import io
import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.accounts.choices import Role
from apps.accounts.models import Membership
from apps.catalog.models import ModelRelease
from apps.evidence.ingest import do_record_job_results
from apps.matrix import grid_cache
from tests.factories import HardwareFactory, JobFactory, ModelReleaseFactory, OrganizationFactory, UserFactory
from tests.portal.bulk import build_matrix
from tests.portal.reports import TIER_STAGES, bound, passing

pytestmark = pytest.mark.django_db

ROW = re.compile(r'<tr data-model="([^"]+)"')


def _queries(client, url: str) -> int:
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(url).status_code == 200
    return len(ctx.captured_queries)


@pytest.mark.parametrize("url", ["/", "/?page=2&page_size=5&tier=1", "/api/v1/matrix/",
                                 "/api/v1/matrix/?page=2&page_size=5"])
def test_queries_are_the_same_at_10_and_200_models(client, url: str) -> None:
    member = UserFactory()
    Membership.objects.create(organization=OrganizationFactory(), user=member, role=Role.VIEWER)
    client.force_login(member)
    build_matrix(10, 6, 0, tag="ten")
    ten = (_queries(client, url), _queries(client, url))  # rendered, then served from the cache
    build_matrix(190, 6, 0, tag="more")
    assert ModelRelease.objects.count() == 200
    two_hundred = (_queries(client, url), _queries(client, url))
    assert ten == two_hundred, (ten, two_hundred)
    assert two_hundred[1] < two_hundred[0]  # the cached grid skips the matrix's own queries


def test_paging_reaches_every_model_once_in_order(client) -> None:
    build_matrix(23, 3, 0, tag="p")
    expected = list(ModelRelease.objects.values_list("slug", flat=True))  # newest release first
    seen, url = [], "/?page_size=5"
    for _ in range(10):
        html = client.get(url).content.decode()
        seen += ROW.findall(html)
        found = re.search(r'<a href="([^"]+)" rel="next">', html)
        if not found:
            break
        url = "/" + found.group(1).replace("&amp;", "&")
    assert seen == expected
    assert "models 21–23 of 23 · page 5 of 5" in html
    assert ROW.findall(client.get("/?page=99&page_size=5").content.decode()) == expected[20:]  # past the end: last
    first = client.get("/").content.decode()
    assert len(ROW.findall(first)) == 20 and "20 of 23 models" not in first  # the default page; the count is all
    assert "23 of 23 models × 3 hardware" in first
    assert len(ROW.findall(client.get("/?page_size=100000").content.decode())) == 23  # bounded, and all fit


def test_search_and_filters_apply_to_every_row_and_keep_the_exports_complete(client) -> None:
    build_matrix(30, 4, 0, tag="f")
    oldest = ModelRelease.objects.order_by("released_at").first()  # on the last page by default
    html = client.get(f"/?q={oldest.name.upper()}").content.decode()
    assert ROW.findall(html) == [oldest.slug]  # "Model 0" only: "Model 01" does not exist
    assert "1 of 30 models" in html
    fragment = client.get(f"/?q={oldest.slug}&fragment=grid").content.decode()  # what the search as you type fetches
    assert fragment.startswith('<div class="matrix-page" data-count="1 of 30 models') and "<form" not in fragment
    assert ROW.findall(fragment) == [oldest.slug]
    tier6 = set(ModelRelease.objects.filter(cells__tier=6).values_list("slug", flat=True))
    shown = []
    for page in range(1, -(-len(tier6) // 10) + 1):
        shown += ROW.findall(client.get(f"/?tier=6&page_size=10&page={page}").content.decode())
    assert set(shown) == tier6 and len(shown) == len(tier6)
    assert ROW.findall(client.get("/?family=no-such-family").content.decode()) == []
    vendor_page = client.get("/?vendor=AMD").content.decode()
    assert 'href="/cells/' in vendor_page and "f-hw-0/" not in vendor_page and "f-hw-1/" in vendor_page
    rows = list(csv.DictReader(io.StringIO(client.get("/export/matrix.csv").content.decode())))
    assert {r["model"] for r in rows} == set(ModelRelease.objects.values_list("slug", flat=True))  # all 30, not a page


def test_a_cell_change_shows_at_once_on_the_cached_page_and_api(client, api_client) -> None:
    model = ModelReleaseFactory(slug="live-1b")
    hardware = HardwareFactory(slug="npu-live")
    td = re.compile(r'<td class="cell([^"]*)"[^>]*><a href="/cells/live-1b/npu-live/">')
    assert td.search(client.get("/").content.decode()).group(1) == " untested"
    assert api_client.get("/api/v1/matrix/").json()["models"][0]["cells"]["npu-live"]["tier"] == 0
    assert _queries(client, "/") == 1  # now cached
    job = JobFactory(model=model, hardware=hardware)
    do_record_job_results(job, bound(job, {"stages": {s: passing(s) for s in TIER_STAGES[3]}}))
    assert td.search(client.get("/").content.decode()).group(1) == " tier-3"
    assert api_client.get("/api/v1/matrix/").json()["models"][0]["cells"]["npu-live"]["tier"] == 3
    model.name = "Renamed Live"  # a model edit shows too
    model.save()
    assert "Renamed Live" in client.get("/").content.decode()


def test_the_cache_never_serves_private_rows_to_another_viewer(client, api_client) -> None:
    lab, other = OrganizationFactory(slug="lab"), OrganizationFactory(slug="other")
    ModelReleaseFactory(slug="secret-1b", organization=lab, visibility="private",
                        released_at=timezone.now() + timedelta(days=3))
    ModelReleaseFactory(slug="open-1b")
    HardwareFactory()
    insider, outsider = UserFactory(username="insider"), UserFactory(username="outsider")
    Membership.objects.create(organization=lab, user=insider, role=Role.VIEWER)
    Membership.objects.create(organization=other, user=outsider, role=Role.VIEWER)
    staff = UserFactory(username="staff", is_staff=True)
    for url in ("/", "/?fragment=grid", "/api/v1/matrix/", "/api/v1/matrix/?page=1"):
        client.force_login(insider)
        assert "secret-1b" in client.get(url).content.decode()  # rendered and cached for the lab's members
        client.force_login(outsider)
        assert "secret-1b" not in client.get(url).content.decode()
        client.logout()
        assert "secret-1b" not in client.get(url).content.decode()
        client.force_login(staff)
        assert "secret-1b" in client.get(url).content.decode()
        client.logout()
        assert "secret-1b" not in client.get(url).content.decode()  # still not, after staff's render


def test_an_entry_for_the_public_expires_when_the_next_embargo_ends() -> None:
    from apps.accounts.access import Actor

    ModelReleaseFactory(slug="soon-1b", visibility="private", released_at=timezone.now() + timedelta(seconds=90))
    assert 1 <= grid_cache._timeout(Actor()) <= 90
    assert grid_cache._timeout(Actor(user_id=1, is_staff=True)) == grid_cache.GRID_SECONDS
    assert grid_cache.scope(Actor(user_id=1, roles={3: "viewer", 1: "admin"})) == "orgs-1-3"


def test_the_api_keeps_its_shape_and_pages_on_request(api_client) -> None:
    build_matrix(12, 2, 0, tag="api")
    whole = api_client.get("/api/v1/matrix/").json()
    assert set(whole) == {"tiers", "hardware", "models"} and len(whole["models"]) == 12
    cell = next(iter(whole["models"][0]["cells"].values()))
    assert set(cell) == {"tier", "tier_name", "failed_stage", "fits", "fits_devices", "fits_dtype", "lead_time_hours",
                         "tier_reached_at", "reached_at", "jobs", "custom_thresholds", "synthetic", "disputed",
                         "engine", "engines"}  # engines: additive (a cell is the best engine's)
    pages = [api_client.get(f"/api/v1/matrix/?page={n}&page_size=5").json() for n in (1, 2, 3)]
    assert [p["page"] for p in pages] == [{"number": n, "size": 5, "pages": 3, "count": 12} for n in (1, 2, 3)]
    assert [m for p in pages for m in p["models"]] == whole["models"]
    assert api_client.get("/api/v1/matrix/?page_size=0").status_code == 400
    assert api_client.get("/api/v1/matrix/?page=x").status_code == 400
    assert api_client.get("/api/v1/matrix/?tier=9").status_code == 400
    browsable = api_client.get("/api/v1/matrix/", HTTP_ACCEPT="text/html")
    assert browsable.status_code == 200 and b"api-model-11" in browsable.content  # the browsable API renders it


def test_the_json_postgresql_writes_is_the_json_python_would() -> None:
    import json
    from datetime import UTC, datetime

    from rest_framework.renderers import JSONRenderer

    from apps.accounts.access import Actor
    from apps.matrix.api.matrix_json import matrix_data, matrix_json
    from apps.matrix.models import Cell
    from apps.matrix.selectors import MatrixFilters

    build_matrix(7, 5, 0, tag="eq")
    ModelRelease.objects.filter(slug="eq-model-1").update(name="Modèle ünï “1”")
    cells = list(Cell.objects.order_by("id"))
    cells[0].current_tier_reached_at = datetime(2025, 3, 1, 12, 30, 5, 120, tzinfo=UTC)  # microseconds
    cells[0].disputed, cells[0].fits, cells[0].fits_plan = ["align", "serve"], None, {}
    cells[1].lead_hours, cells[1].custom_thresholds, cells[1].synthetic = -9.25, True, True
    for c in cells[:2]:
        c.save()
    cells[2].delete()  # a missing cell is null
    actor = Actor()
    for filters in (MatrixFilters(), MatrixFilters(vendor="amd"), MatrixFilters(min_tier=5),
                    MatrixFilters(family="no-such")):
        for number, size in ((None, 50), (1, 3), (3, 3), (9, 3)):
            expected = json.loads(JSONRenderer().render(matrix_data(actor, filters, number, size)))
            assert json.loads(matrix_json(actor, filters, number, size)) == expected, (filters, number)
