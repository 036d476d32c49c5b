"""The API's rows kept per process (``apps/matrix/api/matrix_json.py``): a cell changed in any way (twice in one
transaction, by a bulk update, by raw SQL) rebuilds its model's row only, the others are reused as they are; a
model's own keys, a hardware's slug, an engine's edit and a model's visibility show in the very next response;
the JSON is compact and the value Python writes; the cached body (the rows' deflate blocks joined) reads back
byte for byte."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.renderers import JSONRenderer

from apps.accounts.access import Actor
from apps.catalog.engines import ensure_builtin_engines
from apps.catalog.models import Engine, Hardware, ModelRelease
from apps.matrix import grid_cache
from apps.matrix.api import matrix_json as mj
from apps.matrix.models import Cell
from apps.matrix.selectors import MatrixFilters
from tests.factories import UserFactory
from tests.portal.bulk import build_matrix

pytestmark = pytest.mark.django_db


def _both(filters: MatrixFilters | None = None, actor: Actor | None = None) -> tuple[dict, dict]:
    actor, filters = actor or Actor(), filters or MatrixFilters()
    python = json.loads(JSONRenderer().render(mj.matrix_data(actor, filters, None, 50)))
    return json.loads(mj.matrix_json(actor, filters, None, 50)), python


def _rebuilt(ctx: CaptureQueriesContext) -> list[set[int]]:
    """The model ids of each cells query (the rows built)."""
    return [set(map(int, re.search(r"model_id = ANY\('\{([\d,]*)\}'", q["sql"]).group(1).split(",")))
            for q in ctx.captured_queries if "concat(" in q["sql"]]


def test_a_changed_cell_rebuilds_its_row_only() -> None:
    build_matrix(4, 3, 0, tag="frag")
    ours, python = _both()
    assert ours == python
    cell = Cell.objects.order_by("id").first()
    for change in (
        lambda: Cell.objects.filter(pk=cell.pk).update(tier=2, failed_stage="align"),  # bulk update
        lambda: Cell.objects.filter(pk=cell.pk).update(job_count=7),  # again in the same transaction
        lambda: Cell.objects.filter(pk=cell.pk).update(
            current_tier_reached_at=datetime(2025, 3, 1, 12, 30, 5, tzinfo=UTC), lead_hours=1e-7, fits=False),
        lambda: connection.cursor().execute(f"UPDATE {Cell._meta.db_table} SET synthetic = true, "
                                            "disputed = '[\"serve\"]' WHERE id = %s", [cell.pk]),  # raw SQL
    ):
        change()
        with CaptureQueriesContext(connection) as ctx:
            ours, python = _both()
        assert ours == python
        assert _rebuilt(ctx) == [{cell.model_id}]  # the changed cell's row only
    assert sum(c["synthetic"] for r in ours["models"] for c in r["cells"].values() if c) == 1
    with CaptureQueriesContext(connection) as ctx:
        assert _both()[0] == ours
    assert _rebuilt(ctx) == []  # nothing changed: no cells query at all


def test_unchanged_rows_are_reused_as_they_are() -> None:
    build_matrix(3, 2, 0, tag="same")
    actor, filters = Actor(), MatrixFilters()
    first = mj.matrix_pieces(actor, filters, None, 50)
    changed = ModelRelease.objects.get(slug="same-model-1")
    Cell.objects.filter(model=changed).update(tier=6)
    second = mj.matrix_pieces(actor, filters, None, 50)
    rows = {json.loads(p.data)["slug"]: p for p in first if p.data.startswith(b'{"slug"')}
    again = {json.loads(p.data)["slug"]: p for p in second if p.data.startswith(b'{"slug"')}
    assert again["same-model-0"] is rows["same-model-0"] and again["same-model-2"] is rows["same-model-2"]
    assert again["same-model-1"] is not rows["same-model-1"]
    assert {c["tier"] for c in json.loads(again["same-model-1"].data)["cells"].values()} == {6}


def test_model_hardware_and_engine_edits_show_without_a_cell_change() -> None:
    ensure_builtin_engines()
    build_matrix(3, 2, 0, tag="edit")
    _both()
    # raw SQL: no signal, no cell version; each still shows in the next build
    ModelRelease.objects.filter(slug="edit-model-1").update(name="Renamed “1”")
    ours, python = _both()
    assert ours == python
    assert next(r for r in ours["models"] if r["slug"] == "edit-model-1")["name"] == "Renamed “1”"
    Hardware.objects.filter(slug="edit-hw-0").update(slug="edit-npu")
    ours, python = _both()
    assert ours == python
    assert set(ours["models"][0]["cells"]) == {"edit-npu", "edit-hw-1"}
    # a second engine's cell at the same tier: the default engine's is shown, until the default moves
    day0, vllm = Engine.objects.get(name="day0"), Engine.objects.get(name="vllm")
    for cell in Cell.objects.filter(model__slug="edit-model-2"):
        Cell.objects.create(model_id=cell.model_id, hardware_id=cell.hardware_id, engine=vllm, tier=cell.tier)
    ours, python = _both()
    assert ours == python
    assert {c["engine"] for c in next(r for r in ours["models"] if r["slug"] == "edit-model-2")["cells"].values()} \
        == {"day0"}
    Engine.objects.filter(pk=day0.pk).update(default=False)
    Engine.objects.filter(pk=vllm.pk).update(default=True)
    ours, python = _both()
    assert ours == python
    assert {c["engine"] for c in next(r for r in ours["models"] if r["slug"] == "edit-model-2")["cells"].values()} \
        == {"vllm@0.32.0"}
    for engine in ("day0", "vllm", "vllm@0.32.0", "sglang"):
        assert _both(MatrixFilters(engine=engine))[0] == _both(MatrixFilters(engine=engine))[1], engine


def test_the_api_shows_every_change_in_the_very_next_response(api_client) -> None:
    ensure_builtin_engines()
    build_matrix(3, 2, 0, tag="live")
    staff = UserFactory(is_staff=True)

    def row(slug: str, query: str = "") -> dict | None:
        return next((r for r in api_client.get(f"/api/v1/matrix/{query}").json()["models"] if r["slug"] == slug),
                    None)

    cell = Cell.objects.select_related("model", "hardware").order_by("id").first()
    slug, hw = cell.model.slug, cell.hardware.slug
    assert row(slug)["cells"][hw]["tier"] == cell.tier
    for tier in ((cell.tier + 1) % 7, (cell.tier + 2) % 7):  # saved through the ORM (the portal's writers)
        cell.tier = tier
        cell.save()
        assert row(slug)["cells"][hw]["tier"] == tier
        assert row(slug, "?page=2&page_size=2")["cells"][hw]["tier"] == tier  # the oldest row: the last page
    model = cell.model
    model.name = "Live Renamed"
    model.save()
    assert row(slug)["name"] == "Live Renamed"
    hardware = cell.hardware
    hardware.slug = "live-npu"
    hardware.save()
    assert row(slug)["cells"]["live-npu"]["tier"] == cell.tier and hw not in row(slug)["cells"]
    vllm = Engine.objects.get(name="vllm")
    Cell.objects.create(model=model, hardware=hardware, engine=vllm, tier=cell.tier)
    assert row(slug)["cells"]["live-npu"]["engine"] == "day0"  # a tie: the default engine's
    Engine.objects.filter(default=True).update(default=False)
    vllm.default = True
    vllm.save()  # an engine's edit
    assert row(slug)["cells"]["live-npu"]["engine"] == "vllm@0.32.0"
    assert row(slug, "?engine=day0")["cells"]["live-npu"]["engine"] == "day0"
    model.visibility, model.released_at = "private", timezone.now() + timedelta(days=2)  # an embargo
    model.save()
    assert row(slug) is None  # gone for the public at once
    api_client.force_login(staff)
    assert row(slug)["name"] == "Live Renamed"  # staff still see it


def test_the_cached_body_reads_back_byte_for_byte(api_client) -> None:
    build_matrix(5, 3, 0, tag="bytes")
    ModelRelease.objects.filter(slug="bytes-model-2").update(name="Modèle ünï “2”")
    grid_cache.bump()
    for url in ("/api/v1/matrix/", "/api/v1/matrix/?page=2&page_size=2", "/api/v1/matrix/?vendor=amd"):
        built = api_client.get(url)
        with CaptureQueriesContext(connection) as ctx:
            served = api_client.get(url)
        assert not ctx.captured_queries  # from the cache
        assert served.content == built.content and served["Content-Type"] == "application/json"
        assert json.loads(served.content) == json.loads(mj.matrix_json(Actor(), MatrixFilters.from_params(
            {"vendor": "amd"} if "vendor" in url else {}), 2 if "page" in url else None, 2))


def test_the_text_is_compact() -> None:
    build_matrix(2, 2, 0, tag="compact")
    text = mj.matrix_json(Actor(), MatrixFilters(), None, 50)
    assert '"tier":' in text and '" : ' not in text and '"tier_name":"' in text
    assert json.loads(text)["models"][0]["cells"]
