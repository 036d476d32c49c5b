"""The portal's pages for people, round 2: the matrix at a glance (fits in the checkpoint's own format, signed lead
times, search and filters), the run form through the API's validation and service, the jobs list, model,
hardware and fleet pages, regressions across all series and the comparison of two runs, the Day-0 leaderboard
without hosts, job page states, and errors inside the layout."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.accounts.choices import Role
from apps.accounts.models import Membership
from apps.fleet.models import Agent
from apps.jobs.models import Job
from tests.factories import HardwareFactory, JobFactory, UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def world(django_db_setup, django_db_blocker, db_snapshots):  # noqa: ANN001, ANN201
    """The dashboards' world with the planted regression on the newest run (still open); built once per session
    (the browser tests' round-2 world is the same) and rolled back at the module's end."""
    from django.contrib.contenttypes.models import ContentType
    from django.db import transaction

    from tests.dashboards.world import build_world

    with django_db_blocker.unblock():
        with transaction.atomic():
            yield db_snapshots.restore_or_build("open_regression_world", lambda: build_world(regression_days_ago=1))
            transaction.set_rollback(True)
        ContentType.objects.clear_cache()  # the copy's content type ids were rolled back


def cell_td(html: str, model: str, hardware: str) -> str:
    match = re.search(rf'<td class="cell[^"]*"[^>]*><a href="/cells/{re.escape(model)}/{re.escape(hardware)}/">.*?</td>',
                      html, re.S)
    assert match, (model, hardware)
    return match.group(0)


# --- the matrix ---------------------------------------------------------------------------------------------


def test_fits_are_planned_in_the_checkpoints_own_format_with_a_switch_to_another(client):
    from apps.catalog.seed import seed_catalog
    from apps.matrix.models import Cell

    seed_catalog(include_cpu=False)
    deepseek = Cell.objects.get(model__slug="deepseek-v3", hardware__slug="nvidia-h200")
    assert deepseek.fits_plan["dtype"] == "float8_e4m3fn" and deepseek.fits_devices == 8  # not 16 in bf16
    gpt_oss = Cell.objects.get(model__slug="gpt-oss-120b", hardware__slug="nvidia-h100-sxm")
    assert gpt_oss.fits_plan["dtype"] == "mxfp4" and gpt_oss.fits_devices == 1  # not 4 in bf16
    html = client.get("/").content.decode()
    assert "fits 8× · FP8" in cell_td(html, "deepseek-v3", "nvidia-h200")
    assert "fits 1× · MXFP4" in cell_td(html, "gpt-oss-120b", "nvidia-h100-sxm")
    assert "fits 1× · bf16" in cell_td(html, "llama-3.1-8b", "nvidia-h100-sxm")
    switched = client.get("/?dtype=bfloat16").content.decode()
    assert "fits 16× · bf16" in cell_td(switched, "deepseek-v3", "nvidia-h200")
    assert '<option value="bfloat16" selected>' in switched
    assert client.get("/?dtype=float99").status_code == 200  # an unknown dtype is ignored: the stored estimate


def test_cells_show_tier_date_and_signed_lead_time_and_untested_cells_one_muted_line(world, client_for):
    from apps.matrix.models import Cell

    cell = Cell.objects.get(model=world.model, hardware=world.hardware)
    reached = cell.current_tier_reached_at
    world.model.released_at = reached + timedelta(hours=9)  # reached nine hours before the release
    world.model.save(update_fields=["released_at"])
    try:
        html = client_for(world.viewer).get("/").content.decode()
    finally:
        world.model.released_at = reached - timedelta(days=50)
        world.model.save(update_fields=["released_at"])
    td = cell_td(html, world.model.slug, world.hardware.slug)
    assert f"T{cell.tier} {cell.tier_name}" in td and reached.strftime("%d %b %y") in td
    assert "−9.0\u202fh" in td and "+−" not in html  # signed once, never "+−9h"
    assert "T2 loads: " in td and " from release)" in td  # every tier's date in the tooltip
    untested = HardwareFactory(slug="zz-untested", vendor="Zed")
    html = client_for(world.viewer).get("/").content.decode()
    td = cell_td(html, world.model.slug, untested.slug)
    assert 'class="cell untested"' in td and '<span class="fit-line">fits 1× · bf16</span>' in td
    assert "T0" not in td


def test_matrix_search_and_open_regression_flags_stay_in_the_url(world, client_for):
    client = client_for(world.viewer)
    html = client.get("/?q=TINY").content.decode()
    assert f'<tr data-model="{world.model.slug}"' in html and 'value="TINY"' in html
    hidden = client.get("/?q=no-such-model").content.decode()
    assert f'<tr data-model="{world.model.slug}"' not in hidden  # the server searched every row, not one page
    assert 'id="matrix-none">' in hidden  # "No models match this search" shown
    td = cell_td(html, world.model.slug, world.history_hardware.slug)
    assert "▲ regression" in td and "open regression: " in td
    regressed = client.get("/?regressed=1").content.decode()
    assert f'<tr data-model="{world.model.slug}" data-search=' in regressed
    assert 'href="/export/matrix.csv?vendor=Acme"' in client.get("/?vendor=Acme").content.decode()


# --- the run form -------------------------------------------------------------------------------------------


def test_run_form_creates_a_job_through_the_api_service_and_shows_the_cli_and_curl(world, client_for):
    client = client_for(world.viewer)
    url = f"/cells/{world.model.slug}/{world.other_hardware.slug}/"
    html = client.get(url).content.decode()
    assert 'id="run-form"' in html and "day0 jobs submit --portal http://testserver" in html
    assert f"--model {world.model.slug} --hardware {world.other_hardware.slug}" in html
    assert "curl -sS -X POST http://testserver/api/v1/jobs/" in html
    assert 'id="no-agent"' in html  # nobody serves this hardware's queue
    before = Job.objects.count()
    response = client.post(url + "run/", {"stages": ["plan", "load", "bench"], "dtype": "float16",
                                          "preset": "strict", "concurrency": "1, 8", "input_len": "64",
                                          "tp": "1", "thresholds": "kv_cache_max_len=512"})
    assert response.status_code == 302, response.content[:500]
    job = Job.objects.latest("id")
    assert Job.objects.count() == before + 1 and response["Location"] == f"/jobs/{job.pk}/"
    assert job.spec["stages"] == ["plan", "load", "bench"] and job.spec["dtype"] == "float16"
    assert job.spec["tp"] == 1 and job.spec["bench"] == {"concurrency": [1, 8], "input_len": 64}
    assert job.spec["thresholds"] == {"op_cosine": 0.9999, "layer_cosine": 0.999, "op_max_rel_err": 0.005,
                                      "kv_cache_max_len": 512}
    assert job.requested_by == world.viewer and job.organization == world.public_org


@pytest.mark.parametrize(("field", "value", "names"), [
    ("tp", "0", "tp"), ("thresholds", "op_cosine=2", "threshold op_cosine"), ("thresholds", "no_such_key=1",
                                                                                 "no_such_key"),
    ("concurrency", "0,4", "concurrency"), ("dtype", "float8_e4m3fn", "does not support float8_e4m3fn"),
    ("stages", "", "stages"),
])
def test_run_form_refuses_bad_input_naming_the_field_and_creates_nothing(world, client_for, field, value, names):
    client = client_for(world.viewer)
    data = {"stages": ["plan"], "dtype": "bfloat16", "preset": "default", field: value}
    if field == "stages":
        data.pop("stages")
    before = Job.objects.count()
    response = client.post(f"/cells/{world.model.slug}/{world.hardware.slug}/run/", data)
    assert response.status_code == 400
    html = response.content.decode()
    assert "The job was not created" in html and names in html
    assert Job.objects.count() == before
    assert f'value="{value}"' in html or field in ("dtype", "stages")  # the values as typed stay in the form


def test_only_submitters_see_the_form_and_others_are_refused(world, client_for):
    reader = UserFactory(username="reader")
    Membership.objects.create(organization=world.public_org, user=reader, role=Role.VIEWER)
    url = f"/cells/{world.model.slug}/{world.hardware.slug}/"
    for user in (None, reader):
        client = client_for(user)
        assert 'id="run-form"' not in client.get(url).content.decode()
        response = client.post(url + "run/", {"stages": ["plan"]})
        assert response.status_code == 403 and 'id="error-403"' in response.content.decode()
    outsider = client_for(world.viewer).post(f"/cells/{world.embargoed.slug}/{world.hardware.slug}/run/", {})
    assert outsider.status_code == 404


# --- jobs, models, hardware, fleet ---------------------------------------------------------------------------


def test_jobs_list_filters_by_state_model_hardware_and_organization_and_pages(world, client_for):
    client = client_for(world.viewer)
    html = client.get("/jobs/").content.decode()
    visible = Job.objects.exclude(model=world.embargoed).count()
    assert f"{visible} jobs" in html
    embargoed_job = Job.objects.filter(model=world.embargoed).first()
    assert f'data-job="{embargoed_job.pk}"' not in html  # another organization's embargoed work
    failed = client.get(f"/jobs/?state=failed&hardware={world.other_hardware.slug}").content.decode()
    rows = re.findall(r'<tr data-job="(\d+)"', failed)
    assert rows and all(Job.objects.get(pk=int(r)).state == "failed" for r in rows)
    assert client.get("/jobs/?organization=stealth-lab").content.decode().count("<tr data-job=") == 0
    for _ in range(60 - visible):
        JobFactory(model=world.model, hardware=world.hardware, state="queued")
    page2 = client.get("/jobs/?page=2").content.decode()
    assert "page 2 of" in page2 and 'rel="prev"' in page2
    assert "compare with #" in html


def test_model_page_shows_release_config_parameters_cells_and_its_timeline(world, client_for):
    html = client_for(world.viewer).get(f"/models/{world.model.slug}/").content.decode()
    for part in ('id="parameters"', 'id="config"', 'id="cells"', 'id="timeline"', "hidden size", "KV heads",
                 'class="time-axis"', f'data-hardware="{world.hardware.slug}"', "T2 · loads"):
        assert part in html, part
    assert "device in bfloat16" in html and "1 devices" not in html  # plural agreement
    assert client_for(world.viewer).get(f"/models/{world.embargoed.slug}/").status_code == 404
    assert client_for(world.insider).get(f"/models/{world.embargoed.slug}/").status_code == 200


def test_hardware_and_fleet_pages_show_agents_their_stack_and_current_job(world, client_for):
    job = Job.objects.filter(model=world.model, hardware=world.hardware).first()
    secret_job = Job.objects.filter(model=world.embargoed).first()
    Agent.objects.create(hardware=world.hardware, hostname="node-1", last_heartbeat_at=timezone.now(),
                         versions={"torch": "2.13.0", "driver": "550.54"}, current_job=job)
    Agent.objects.create(hardware=world.hardware, hostname="node-2", current_job=secret_job,
                         last_heartbeat_at=timezone.now() - timedelta(hours=2))
    client = client_for(world.viewer)
    html = client.get(f"/hardware/{world.hardware.slug}/").content.decode()
    for part in ('id="spec"', 'id="collectives"', 'id="agents"', 'id="cells"', "node-1", "● online", "torch 2.13.0",
                 f'href="/jobs/{job.pk}/"', "○ offline", "busy", f'data-model="{world.model.slug}"'):
        assert part in html, part
    assert f'data-model="{world.embargoed.slug}"' not in html and f"/jobs/{secret_job.pk}/" not in html
    fleet = client.get("/agents/").content.decode()
    assert "2 registered" in fleet and "node-2" in fleet and world.hardware.name in fleet
    listing = client.get("/hardware/").content.decode()
    assert f'href="/hardware/{world.hardware.slug}/"' in listing and "1 of 2" in listing
    assert client.get("/hardware/no-such/").status_code == 404


# --- regressions and comparison -----------------------------------------------------------------------------


def test_regressions_page_lists_every_series_newest_first_linked_to_the_two_runs(world, client_for):
    client = client_for(world.viewer)
    html = client.get("/regressions/").content.decode()
    whens = re.findall(r'<tr class="regression-row[^"]*"[^>]*>\s*<td>([\d: -]+)', html)
    assert whens and whens == sorted(whens, reverse=True)
    pairs = re.findall(r'href="/compare/\?a=(\d+)&amp;b=(\d+)" class="compare-link"', html)
    assert pairs and all(int(a) < int(b) for a, b in pairs)
    assert '<span class="reg-open">open</span>' in html
    only_open = client.get("/regressions/?open=1").content.decode()
    assert only_open.count('class="regression-row open"') == only_open.count('class="regression-row')
    assert "No regressions flagged for these filters" in client.get(
        f"/regressions/?model={world.model.slug}&since=2099-01-01").content.decode()
    bad = client.get("/regressions/?since=yesterday").content.decode()
    assert "since must be an ISO date" in bad
    assert "no model with slug" in client.get(f"/regressions/?model={world.embargoed.slug}").content.decode()
    trends = client.get("/trends/").content.decode()  # opens on what changed most recently
    assert f'value="{world.model.slug}|{world.history_hardware.slug}" selected' in trends


def test_trends_without_a_cell_is_cached_until_new_benchmark_results_arrive(world, client_for):
    import random

    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from apps.benchmarks.seeding import Clock, run_benchmark_history
    from tests.dashboards.world import NOW

    client = client_for(world.viewer)
    opened = f'value="{world.model.slug}|{world.history_hardware.slug}" selected'
    with CaptureQueriesContext(connection) as first:
        assert opened in client.get("/trends/").content.decode()
    with CaptureQueriesContext(connection) as second:
        assert opened in client.get("/trends/").content.decode()
    assert len(second) < len(first)  # the newest flagged run comes from the cache, not from every series again
    other = world.other_hardware if world.history_hardware == world.hardware else world.hardware
    # a newer regression on another cell, as an agent's results would bring it: the page follows at once
    run_benchmark_history(world.model, other, Clock(NOW), random.Random(5), start=NOW - timedelta(days=11), days=13,
                          regression_day=12)
    assert f'value="{world.model.slug}|{other.slug}" selected' in client.get("/trends/").content.decode()


def test_compare_page_puts_benchmarks_alignment_and_env_side_by_side(world, client_for):
    client = client_for(world.viewer)
    html = client.get("/regressions/").content.decode()
    a, b = re.search(r'href="/compare/\?a=(\d+)&amp;b=(\d+)" class="compare-link"', html).groups()
    page = client.get(f"/compare/?a={a}&b={b}").content.decode()
    for part in ('id="side-a"', 'id="side-b"', 'id="compare-bench"', "concurrency 1", "TTFT p50", "▲ ×",
                 f'href="/jobs/{a}/"', f'href="/jobs/{b}/"'):
        assert part in page, part
    full = Job.objects.filter(model=world.model, hardware=world.hardware).order_by("created_at")[0]
    failed = Job.objects.filter(model=world.model, hardware=world.other_hardware).order_by("created_at")[0]
    both = client.get(f"/compare/?a={failed.pk}&b={full.pk}").content.decode()
    assert 'id="compare-alignment"' in both and "token match rate" in both and "runtime commit" in both
    assert "different cells" in both
    assert client.get("/compare/?a=1&b=x").status_code == 400
    secret = Job.objects.filter(model=world.embargoed).first()
    assert client.get(f"/compare/?a={secret.pk}&b={full.pk}").status_code == 404


# --- Day-0 timeline, job page, layout ------------------------------------------------------------------------


def test_day0_leaderboard_leaves_out_hosts_unless_asked(world, client_for):
    import random

    from apps.benchmarks.seeding import run_adaptation, simulated_clock

    host = HardwareFactory(slug="cpu-host", name="Demo CPU", shared_memory=True)
    with simulated_clock(world.model.released_at + timedelta(minutes=5)) as clock:
        run_adaptation(world.model, host, "validated", clock, random.Random(4))
    client = client_for(world.viewer)
    html = client.get("/day0/").content.decode()
    board = html.split('id="leaderboard"')[1].split('id="releases"')[0]
    assert "Demo CPU" not in board.split('id="hosts-note"')[0] and "Left out: Demo CPU" in board
    assert 'class="time-axis"' in html and "release</span>" in html
    with_hosts = client.get("/day0/?hosts=1").content.decode().split('id="leaderboard"')[1].split('id="releases"')[0]
    assert "<strong>Demo CPU</strong>" in with_hosts


def test_job_page_shows_skipped_stages_end_state_and_the_missing_agent(world, client_for):
    from apps.jobs.eventlog import do_store_job_events

    failed = JobFactory(model=world.model, hardware=world.other_hardware, state="failed", failed_stage="load")
    now = timezone.now()
    do_store_job_events(failed, [
        {"seq": i + 1, "ts": now, "stage": stage, "kind": kind, "level": "info", "message": "", "data": data}
        for i, (stage, kind, data) in enumerate([
            ("plan", "stage_started", {}), ("plan", "stage_finished", {"passed": True}),
            ("load", "stage_started", {}), ("load", "stage_finished", {"passed": False})])])
    html = client_for(world.viewer).get(f"/jobs/{failed.pk}/").content.decode()
    statuses = re.findall(r'data-stage="(\w+)" data-status="(\w+)"', html)
    after = [s for _, s in statuses[[s for _, s in statuses].index("failed") + 1:]]
    assert after and set(after) == {"skipped"}
    assert "finished: failed" in html and 'id="no-agent"' not in html
    queued = JobFactory(model=world.model, hardware=world.other_hardware, state="queued")
    html = client_for(world.viewer).get(f"/jobs/{queued.pk}/").content.decode()
    assert 'id="no-agent"' in html and f"hw.{world.other_hardware.slug}" in html and "not connected" in html
    assert 'id="compare-previous"' in html


def test_one_navigation_bar_marks_the_current_page_and_errors_render_inside_it(world, client_for):
    client = client_for(world.viewer)
    for url, label in (("/", "Matrix"), ("/jobs/", "Jobs"), ("/regressions/", "Regressions"),
                       (f"/cells/{world.model.slug}/{world.hardware.slug}/", "Matrix"), ("/agents/", "Agents")):
        html = client.get(url).content.decode()
        assert html.count("<nav") == 1 + html.count('class="pager"'), url
        assert f'aria-current="page">{label}</a>' in html, url
    missing = client.get("/models/no-such-model/")
    assert missing.status_code == 404
    assert 'class="topbar"' in missing.content.decode() and 'id="error-404"' in missing.content.decode()
    assert 'rel="icon"' in missing.content.decode()
    assert client.get("/favicon.ico")["Location"] == "/static/img/favicon.svg"


def test_open_regression_flags_follow_new_runs_and_stay_per_viewer(world, client_for):
    import random

    from apps.benchmarks.seeding import run_benchmark_history, simulated_clock
    from tests.dashboards.world import NOW

    viewer = client_for(world.viewer)
    assert "▲ regression" in cell_td(viewer.get("/").content.decode(), world.model.slug, world.history_hardware.slug)
    with simulated_clock(NOW + timedelta(hours=6)) as clock:  # a normal run after the regressed one
        run_benchmark_history(world.model, world.history_hardware, clock, random.Random(9),
                              start=NOW + timedelta(hours=6), days=1)
    td = cell_td(viewer.get("/").content.decode(), world.model.slug, world.history_hardware.slug)
    assert "▲ regression" not in td  # recomputed: the newest run is no longer flagged
    cell = viewer.get(f"/cells/{world.model.slug}/{world.history_hardware.slug}/").content.decode()
    assert 'id="cell-regressions"' not in cell
    insider = client_for(world.insider).get("/").content.decode()  # another viewer: its own cached entry
    assert world.embargoed.slug in insider
