"""Dashboard pages and exports against seeded evidence: what each shows, and that an embargoed model of
another organization answers 404 everywhere."""

from __future__ import annotations

import csv
import io
import json

import pytest

pytestmark = pytest.mark.django_db


def test_cell_page_shows_ladder_plan_checklist_alignment_benchmarks_env_and_jobs(world, client_for):
    page = client_for(None).get(f"/cells/{world.model.slug}/{world.history_hardware.slug}/")
    assert page.status_code == 200
    html = page.content.decode()
    for section in ('id="ladder"', 'id="plan"', 'id="checklist"', 'id="alignment"', 'id="benchmarks"',
                    'id="environment"', 'id="jobs"'):
        assert section in html
    assert "T6 · validated" in html  # the validated outcome reached the top tier
    assert 'data-chart="layers"' in html and 'id="layer-chart-data"' in html
    assert 'data-chart="bench"' in html and 'id="bench-chart-data"' in html
    assert "aten::rms_norm" in html and "aten::pow" in html  # a decomposition is listed
    assert html.count('data-status="') >= 20  # one row per operator
    assert "Memory per device" in html and "<meter" in html
    assert "torch</dt><dd>2.13.0" in html.replace("\n", "")


def test_cell_page_shows_failed_alignment_with_the_divergence_and_both_top5(world, client_for):
    html = client_for(None).get(f"/cells/{world.model.slug}/{world.other_hardware.slug}/").content.decode()
    assert "failed at align" in html
    assert "✗ failed" in html
    assert "first divergence at token" in html
    assert "reference top-5" in html and "target top-5" in html
    assert "hard divergence" in html


def test_unreported_peak_memory_shows_a_dash_not_zero_bytes(world, client_for):
    from apps.evidence.models import BenchmarkPoint

    BenchmarkPoint.objects.filter(run__model=world.model, run__hardware=world.history_hardware).update(
        peak_memory_bytes=None)
    html = client_for(None).get(f"/cells/{world.model.slug}/{world.history_hardware.slug}/").content.decode()
    table = html.split('id="benchmarks"')[1]
    assert 'data-label="peak memory"><span title="the server did not report it">—</span>' in table
    assert "0 bytes" not in table
    from apps.evidence.models import LoadReport

    LoadReport.objects.filter(result__job__model=world.model, result__job__hardware=world.history_hardware).update(
        peak_rss_bytes=None)
    html = client_for(None).get(f"/cells/{world.model.slug}/{world.history_hardware.slug}/").content.decode()
    assert "peak RSS —" in html and "0 bytes" not in html


def test_checklist_filter_works_without_javascript(world, client_for):
    html = client_for(None).get(f"/cells/{world.model.slug}/{world.hardware.slug}/?status=decomposed").content.decode()
    assert 'id="checklist" data-filter="decomposed"' in html
    assert 'href="?status=decomposed#checklist" data-status-filter="decomposed" aria-current="true"' in html


def test_unknown_cell_is_404(world, client_for):
    assert client_for(None).get(f"/cells/{world.model.slug}/no-such-hw/").status_code == 404
    assert client_for(None).get(f"/cells/no-such-model/{world.hardware.slug}/").status_code == 404


def test_job_page_shows_stages_log_and_cancel_only_for_allowed_users(world, client_for):
    from apps.jobs.models import Job

    job = Job.objects.filter(model=world.model, hardware=world.other_hardware).order_by("created_at").first()
    html = client_for(world.viewer).get(f"/jobs/{job.pk}/").content.decode()
    assert f'data-ws-path="/ws/jobs/{job.pk}/"' in html
    assert 'data-stage="align" data-status="failed"' in html
    assert 'data-stage="load" data-status="done"' in html
    assert "align failed: layer cosine below" in html
    assert 'id="cancel-job"' not in html  # the job is finished
    Job.objects.filter(pk=job.pk).update(state="running")
    assert 'id="cancel-job"' in client_for(world.viewer).get(f"/jobs/{job.pk}/").content.decode()
    assert 'id="cancel-job"' not in client_for(None).get(f"/jobs/{job.pk}/").content.decode()
    assert 'id="cancel-job"' not in client_for(world.insider).get(f"/jobs/{job.pk}/").content.decode()


def test_job_page_log_and_timeline_are_node_0s_sequence(world, client_for):
    """Another node's events have their own seqs: they never mix into node 0's console or stage timeline."""
    from django.utils import timezone

    from apps.jobs.models import Job, JobEvent

    job = Job.objects.filter(model=world.model, hardware=world.other_hardware).order_by("created_at").first()
    JobEvent.objects.create(job=job, node=1, seq=1, ts=timezone.now(), stage="align", kind="stage_started", level="info",
                            message="node 1 line that must stay off node 0's console")
    JobEvent.objects.create(job=job, node=1, seq=2, ts=timezone.now(), stage="align", kind="stage_finished", level="info",
                            message="node 1 align done", data={"passed": True, "seconds": 1.0})
    html = client_for(world.viewer).get(f"/jobs/{job.pk}/").content.decode()
    assert "node 1 line" not in html
    assert 'data-stage="align" data-status="failed"' in html  # node 1's pass does not overwrite node 0's fail


def test_cancel_button_follows_the_cancel_service_for_a_job_without_organization(world, client_for):
    from apps.accounts.access import Actor
    from apps.jobs.models import Job
    from apps.jobs.services import can_cancel_job

    job = Job.objects.filter(model=world.model, hardware=world.other_hardware).order_by("created_at").first()
    Job.objects.filter(pk=job.pk).update(state="running", organization=None, requested_by=None)
    job.refresh_from_db()
    # a submitter of some organization is not the requester of a job without one: no button, and no cancel
    assert not can_cancel_job(Actor(user_id=world.viewer.pk, roles={world.public_org.pk: "submitter"}), job)
    assert 'id="cancel-job"' not in client_for(world.viewer).get(f"/jobs/{job.pk}/").content.decode()
    assert client_for(world.viewer).post(f"/api/v1/jobs/{job.pk}/cancel/").status_code == 403


def test_trends_page_charts_every_metric_and_lists_the_planted_regression(world, client_for):
    html = client_for(None).get(f"/trends/?model={world.model.slug}&hardware={world.history_hardware.slug}"
                                ).content.decode()
    for family in ("ttft_ms", "tpot_ms", "itl_ms", "output_tok_s", "peak_memory_bytes"):
        assert f'id="trend-{family}"' in html
    day = world.regression.at.strftime("%Y-%m-%d")
    assert day in html.split('id="regressions"')[1]
    assert 'data-metric="ttft_ms_p50" data-flagged="0"' not in html
    assert 'data-metric="output_tok_s" data-flagged="0"' not in html


def test_trends_page_bad_filter_is_reported_not_a_500(world, client_for):
    response = client_for(None).get(f"/trends/?model={world.model.slug}&hardware={world.hardware.slug}&since=yesterday")
    assert response.status_code == 200
    assert "since must be an ISO date" in response.content.decode()


def test_day0_timeline_shows_hours_to_each_tier_and_a_leaderboard(world, client_for):
    html = client_for(None).get("/day0/").content.decode()
    assert world.model.name in html
    leaderboard = html.split('id="leaderboard"')[1].split('id="releases"')[0]
    assert world.hardware.slug in leaderboard and world.other_hardware.slug in leaderboard
    rows = html.split(f'data-model="{world.model.slug}"')[1].split("</details>")[0]
    assert " h</td>" in rows or " d</td>" in rows
    assert client_for(None).get("/day0/?tier=9").status_code == 200  # an unknown tier falls back to serves


def test_badges_use_the_portals_tier_palette():
    import re
    from pathlib import Path

    from django.conf import settings

    from apps.dashboards.badges import TIER_COLOURS

    css = (Path(settings.BASE_DIR) / "static" / "css" / "day0.css").read_text()
    palette = {int(n): colour for n, colour in re.findall(r"--tier-(\d)-line: (#[0-9a-f]+);", css)}
    assert palette == {tier: bg for tier, (bg, _) in TIER_COLOURS.items()}


def test_badge_is_an_svg_naming_the_tier(world, client_for):
    response = client_for(None).get(f"/badges/{world.model.slug}/{world.hardware.slug}.svg")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("image/svg+xml")
    svg = response.content.decode()
    assert svg.startswith("<svg") and "T6 validated" in svg and world.hardware.slug in svg
    assert response["Cache-Control"] == "max-age=300, public"
    failed = client_for(None).get(f"/badges/{world.model.slug}/{world.other_hardware.slug}.svg").content.decode()
    assert "failed at align" in failed


def test_matrix_csv_does_not_hand_a_spreadsheet_a_formula(world, client_for):
    from apps.catalog.models import ModelRelease

    ModelRelease.objects.filter(pk=world.model.pk).update(name='=HYPERLINK("http://x.example","Tiny")')
    rows = list(csv.DictReader(io.StringIO(client_for(None).get("/export/matrix.csv").content.decode())))
    names = {r["model_name"] for r in rows if r["model"] == world.model.slug}
    assert names == {"'=HYPERLINK(\"http://x.example\",\"Tiny\")"}
    from apps.core.csvfiles import csv_field

    assert csv_field(-2.5) == -2.5 and csv_field("-2 h") == "'-2 h" and csv_field(None) == ""  # numbers kept


def test_matrix_exports_in_csv_and_json(world, client_for):
    rows = list(csv.DictReader(io.StringIO(client_for(None).get("/export/matrix.csv").content.decode())))
    mine = {(r["model"], r["hardware"]): r for r in rows}
    assert mine[(world.model.slug, world.hardware.slug)]["tier_name"] == "validated"
    from apps.matrix.models import Cell

    cell = Cell.objects.get(model=world.model, hardware=world.hardware)  # when the current tier was reached
    assert mine[(world.model.slug, world.hardware.slug)]["reached_at"] == cell.current_tier_reached_at.isoformat()
    assert mine[(world.model.slug, world.other_hardware.slug)]["failed_stage"] == "align"
    data = json.loads(client_for(None).get("/export/matrix.json").content)
    assert data["count"] == len(data["cells"]) == len(rows)
    assert client_for(None).get("/export/matrix.xml").status_code == 404


@pytest.mark.parametrize("user", ["anonymous", "viewer"])
def test_an_embargoed_model_is_invisible_to_other_organizations_everywhere(world, client_for, user):
    client = client_for(None if user == "anonymous" else world.viewer)
    slug, hw = world.embargoed.slug, world.hardware.slug
    for url in (f"/cells/{slug}/{hw}/", f"/badges/{slug}/{hw}.svg", f"/trends/?model={slug}&hardware={hw}",
                f"/api/v1/benchmarks/?model={slug}", f"/api/v1/benchmarks/regressions/?model={slug}"):
        assert client.get(url).status_code == 404, url
    from apps.jobs.models import Job

    job = Job.objects.filter(model=world.embargoed).first()
    assert client.get(f"/jobs/{job.pk}/").status_code == 404
    for url in ("/export/matrix.csv", "/export/matrix.json", "/day0/", "/trends/", "/api/v1/benchmarks/",
                "/api/v1/benchmarks/regressions/", "/api/v1/benchmarks/?format=csv"):
        body = client.get(url).content.decode()
        assert slug not in body and world.embargoed.name not in body, url


def test_the_embargoed_models_own_organization_sees_it(world, client_for):
    client = client_for(world.insider)
    slug, hw = world.embargoed.slug, world.hardware.slug
    assert client.get(f"/cells/{slug}/{hw}/").status_code == 200
    assert client.get(f"/badges/{slug}/{hw}.svg").status_code == 200
    assert slug in client.get("/export/matrix.csv").content.decode()
    assert world.embargoed.name in client.get("/day0/").content.decode()
    assert "(before release)" in client.get("/day0/").content.decode()
