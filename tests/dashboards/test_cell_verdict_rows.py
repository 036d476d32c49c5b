"""The cell page's verdicts table follows the pipeline's stage order (the JSON column keeps no key order)."""

from __future__ import annotations

from apps.dashboards.selectors.cell import CellPage
from apps.matrix.models import Cell


def test_verdicts_are_listed_in_pipeline_order_with_unknown_stages_last() -> None:
    # the order PostgreSQL's jsonb hands the keys back: shortest first
    stored = {s: {"status": "pass"} for s in ("env", "eval", "load", "plan", "align", "bench", "serve", "zzz",
                                              "inventory")}
    page = CellPage(model=None, hardware=None, cell=Cell(verdicts=stored), ladder=[], results={})
    assert [stage for stage, _ in page.verdict_rows] == ["plan", "load", "inventory", "align", "serve", "bench",
                                                         "eval", "env", "zzz"]
    assert CellPage(model=None, hardware=None, cell=None, ladder=[], results={}).verdict_rows == []
