"""The Day-0 leaderboard ranks only cells judged on the default thresholds from agent evidence whose claims the
portal shares; custom-threshold, synthetic and disputed cells are shown marked and listed apart, and their
badges say so."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from apps.evidence.ingest import do_record_job_results
from apps.matrix.models import Cell
from tests.factories import HardwareFactory, JobFactory, ModelReleaseFactory
from tests.portal.reports import bound, passing

pytestmark = pytest.mark.django_db

# hardware slug -> (job spec extras, plan section changes, the mark the cell carries)
CELLS = {
    "clean-npu": ({}, {}, None),
    "loose-npu": ({"thresholds": {"op_cosine": 0.9}}, {}, "custom thresholds"),
    "seeded-npu": ({"seeded": True}, {}, "synthetic"),
    "modest-npu": ({}, {"fits": False}, "disputed"),  # the agent says it does not fit; the portal's planner says it does
}


def test_marked_cells_are_left_out_of_the_ranking_and_marked_on_page_and_badge(client) -> None:
    model = ModelReleaseFactory(slug="rank-1b", released_at=datetime(2026, 11, 1, tzinfo=UTC))
    for slug, (extra, plan, _) in CELLS.items():
        hardware = HardwareFactory(slug=slug, name=slug.upper())
        job = JobFactory(model=model, hardware=hardware, spec={"stages": ["plan", "load"], "dtype": "bfloat16", **extra})
        do_record_job_results(job, bound(job, {"stages": {"plan": {**passing("plan"), **plan},
                                                          "load": passing("load")}}))
    cells = {c.hardware.slug: c for c in Cell.objects.filter(model=model).select_related("hardware")}
    assert all(c.tier == 2 for c in cells.values())
    assert (cells["loose-npu"].custom_thresholds, cells["seeded-npu"].synthetic, cells["modest-npu"].disputed) == (
        True, True, ["plan"])
    html = client.get("/day0/?tier=2").content.decode()
    board = html.split('id="leaderboard"')[1].split('id="releases"')[0]
    ranked = board.split("<tbody>")[1].split("</tbody>")[0]
    ranks = [row.split('<td class="num">')[1].split("</td>")[0] for row in ranked.split("<tr>")[1:]]
    named = [row.split("<strong>")[1].split("</strong>")[0] for row in ranked.split("<tr>")[1:]]
    assert dict(zip(named, ranks, strict=True))["CLEAN-NPU"] == "1"
    assert all(rank == "–" for name, rank in zip(named, ranks, strict=True) if name != "CLEAN-NPU")  # no medians
    assert "left out of the medians" in board
    unranked = board.split('id="unranked"')[1].split("</ul>")[0]
    for slug, (_, _, mark) in CELLS.items():
        assert (f"on {slug.upper()}" in unranked) is (mark is not None)
        if mark:
            assert f"on {slug.upper()}</a> <span class=\"muted\">({mark})" in unranked
    release = html.split('data-model="rank-1b"')[1].split("</details>")[0]
    assert release.count('class="mark-pill"') == 3
    for slug, (_, _, mark) in CELLS.items():
        svg = client.get(f"/badges/rank-1b/{slug}.svg").content.decode()
        assert "T2 loads" in svg and ((f" · {mark}" in svg) if mark else "·" not in svg), svg
