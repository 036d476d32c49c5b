"""The API's cell texts kept per process by row version (``apps/matrix/api/matrix_json.py``): a cell changed in
any way, twice in one transaction, by a bulk update or by raw SQL, is rebuilt; the rest are reused; the text is
compact and the same JSON value Python writes."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.renderers import JSONRenderer

from apps.accounts.access import Actor
from apps.matrix.api import matrix_json as mj
from apps.matrix.models import Cell
from apps.matrix.selectors import MatrixFilters
from tests.portal.bulk import build_matrix

pytestmark = pytest.mark.django_db


def _both() -> tuple[dict, dict]:
    actor, filters = Actor(), MatrixFilters()
    python = json.loads(JSONRenderer().render(mj.matrix_data(actor, filters, None, 50)))
    return json.loads(mj.matrix_json(actor, filters, None, 50)), python


def test_changed_cells_are_rebuilt_and_the_others_reused() -> None:
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
        built = [q["sql"] for q in ctx.captured_queries if "concat(" in q["sql"]]
        assert len(built) == 1 and f"ANY('{{{cell.pk}}}'::" in built[0]  # the changed cell only
    assert sum(c["synthetic"] for r in ours["models"] for c in r["cells"].values() if c) == 1


def test_the_text_is_compact() -> None:
    build_matrix(2, 2, 0, tag="compact")
    text = mj.matrix_json(Actor(), MatrixFilters(), None, 50)
    assert '"tier":' in text and '" : ' not in text and '"tier_name":"' in text
