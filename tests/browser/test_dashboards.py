"""The dashboards in a real Chromium against the ASGI server (HTTP and WebSockets) on PostgreSQL and Redis."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import httpx
import pytest

from tests.browser.pages import open_page
from tests.dashboards.world import build_world
from tests.factories import JobFactory, make_token

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def world(transactional_db, db_snapshots):  # noqa: ANN001, ANN201
    return db_snapshots.restore_or_build("dashboards_world", build_world)


def chart_option(page, element_id: str) -> dict:
    return page.evaluate(
        "id => JSON.parse(JSON.stringify(echarts.getInstanceByDom(document.getElementById(id)).getOption(),"
        " (k, v) => typeof v === 'function' ? undefined : v))", element_id)


def test_matrix_renders_and_filters(world, portal_server, browser_factory, login_cookie, shot):
    page = open_page(browser_factory, portal_server, login_cookie, world.viewer)
    page.goto("/")
    table = page.locator("table#matrix")
    table.wait_for()
    assert table.locator(f'tr[data-model="{world.model.slug}"]').count() == 1
    assert table.locator("thead th").count() == 3  # the model column and two hardware
    from apps.matrix.models import Cell

    cell = Cell.objects.get(model=world.model, hardware=world.hardware)
    label = table.locator(f'a[href="/cells/{world.model.slug}/{world.hardware.slug}/"] .tier-label')
    assert label.inner_text() == f"T{cell.tier} {cell.tier_name}"  # the tier as text, not only as colour
    shot(page, "desktop")
    page.select_option("select[name=vendor]", "Bolt")  # applies without a click, and stays in the URL
    page.wait_for_url("**vendor=Bolt**")
    assert page.locator("table#matrix thead th").count() == 2
    assert page.locator(f'a[href="/cells/{world.model.slug}/{world.other_hardware.slug}/"]').count() == 1
    assert page.locator(f'a[href="/cells/{world.model.slug}/{world.hardware.slug}/"]').count() == 0
    shot(page, "filtered")
    phone = open_page(browser_factory, portal_server, login_cookie, world.viewer, phone=True)
    phone.goto("/")
    phone.locator("table#matrix").wait_for()
    shot(phone, "phone")
    assert not page.js_errors and not phone.js_errors


def test_cell_page_shows_checklist_alignment_chart_and_benchmarks(world, portal_server, browser_factory,
                                                                  login_cookie, shot):
    page = open_page(browser_factory, portal_server, login_cookie)
    page.goto(f"/cells/{world.model.slug}/{world.history_hardware.slug}/")
    assert page.locator("#ladder .tier-pill[data-tier='6']").first.inner_text() == "T6 · validated"
    rows = page.locator("#checklist tbody tr")
    total = rows.count()
    assert total >= 20
    page.click("#checklist [data-status-filter='decomposed']")
    visible = [r for r in rows.all() if r.is_visible()]
    assert 0 < len(visible) < total and all(r.get_attribute("data-status") == "decomposed" for r in visible)
    assert "aten::" in visible[0].inner_text()
    page.click("#checklist [data-status-filter='all']")
    assert sum(1 for r in rows.all() if r.is_visible()) == total
    page.locator("#layer-chart[data-rendered=true] canvas").wait_for()
    layers = chart_option(page, "layer-chart")
    assert len(layers["series"][0]["data"]) == len(layers["xAxis"][0]["data"]) > 10
    page.locator("#bench-chart[data-rendered=true] canvas").wait_for()
    bench = chart_option(page, "bench-chart")
    assert bench["xAxis"][0]["data"] == ["1", "4", "16", "64"]
    assert page.locator("#bench-table tbody tr").count() == 4
    stages = page.eval_on_selector_all("#verdicts tbody tr", "rows => rows.map(r => r.dataset.stage)")
    assert stages[:4] == ["plan", "load", "inventory", "align"], stages  # pipeline order, not the JSON column's
    for part in ("#jobs .job-state", '#jobs td[data-label="created"]', "#jobs .compare-link"):
        assert page.locator(part).first.bounding_box()["height"] < 40, part  # one line each (two are ~50 px)
    shot(page, "desktop")
    phone = open_page(browser_factory, portal_server, login_cookie, phone=True)
    phone.goto(f"/cells/{world.model.slug}/{world.other_hardware.slug}/")
    assert phone.locator(".failed-pill").first.inner_text().endswith("failed at align")
    assert phone.locator(".divergence").count() >= 1
    shot(phone, "phone-failed-align")
    assert not page.js_errors and not phone.js_errors


def test_job_page_shows_live_events_replays_after_reconnect_and_cancels(world, portal_server, browser_factory,
                                                                          login_cookie, shot):
    job = JobFactory(model=world.model, hardware=world.other_hardware, requested_by=world.viewer,
                     organization=world.public_org)
    agent = make_token(organization=world.public_org, scopes=["agent"], hardware=world.other_hardware,
                       role="admin", name="agent")
    seq = 0

    def post(*events: tuple[str, str, str, dict | None]) -> None:
        nonlocal seq
        batch = []
        for stage, kind, message, data in events:
            seq += 1
            batch.append({"seq": seq, "ts": datetime.now(UTC).isoformat(), "stage": stage, "kind": kind,
                          "level": "error" if "boom" in message else "info", "message": message, "data": data})
        response = httpx.post(f"{portal_server}/api/v1/jobs/{job.pk}/events/", json={"events": batch},
                              headers={"Authorization": f"Token {agent.secret}"}, timeout=10)
        assert response.status_code == 200, response.text
        assert response.json()["acked"] == seq

    post(("plan", "stage_started", "plan started", {"stage": "plan"}))  # before the page opens: replayed
    page = open_page(browser_factory, portal_server, login_cookie, world.viewer)
    page.goto(f"/jobs/{job.pk}/")
    page.locator("#ws-status.live").wait_for()
    post(("plan", "stage_finished", "plan passed in 0.1 s", {"stage": "plan", "passed": True, "seconds": 0.1}),
         ("load", "stage_started", "load started", {"stage": "load"}),
         ("load", "progress", "tensors: 30/120", {"done": 30, "total": 120, "what": "tensors"}),
         ("load", "log", "loading shard 1 of 4", None))
    page.locator("#job-log li", has_text="loading shard 1 of 4").wait_for()
    assert page.locator('.stage-timeline [data-stage="plan"]').get_attribute("data-status") == "done"
    load = page.locator('.stage-timeline [data-stage="load"]')
    assert load.get_attribute("data-status") == "running"
    page.wait_for_function("document.querySelector('[data-stage=load] progress').value === 30")
    assert "tensors: 30/120 (25%)" in load.inner_text()

    # the connection drops; events posted meanwhile arrive once, in order, after the reconnect
    page.evaluate("window.day0JobConsole.socket().close()")
    page.locator("#ws-status.closed").wait_for()
    post(("load", "log", "loading shard 2 of 4", None), ("load", "log", "boom: shard 3 checksum retry", None))
    page.locator("#ws-status.live").wait_for(timeout=20_000)
    page.locator("#job-log li", has_text="boom: shard 3").wait_for()
    seqs = [int(s) for s in page.eval_on_selector_all("#job-log li", "els => els.map(e => e.dataset.seq)")]
    assert seqs == sorted(set(seqs)) and seqs[-1] == seq
    assert page.locator("#job-log li.level-error").count() == 1

    # auto-scroll follows new lines; scrolling up pauses it
    post(*[("load", "log", f"tensor batch {i}", None) for i in range(60)])
    page.locator("#job-log li", has_text="tensor batch 59").wait_for()
    at_bottom = "(() => { const l = document.getElementById('job-log'); " \
                "return l.scrollHeight - l.scrollTop - l.clientHeight < 30; })()"
    page.wait_for_function(at_bottom)
    page.evaluate("document.getElementById('job-log').scrollTop = 0")
    page.wait_for_function("!document.getElementById('auto-scroll').checked")
    post(("load", "log", "one more line", None))
    page.locator("#job-log li", has_text="one more line").wait_for()
    assert not page.evaluate(at_bottom)
    page.check("#auto-scroll")

    # level filter: hiding info leaves the error line
    page.uncheck("input[data-level-filter=info]")
    assert page.locator("#job-log li.level-info").first.is_hidden()
    assert page.locator("#job-log li.level-error").is_visible()
    page.check("input[data-level-filter=info]")
    shot(page, "live")

    page.on("dialog", lambda dialog: dialog.accept())
    page.click("#cancel-job")
    page.locator("#job-state.state-cancelled").wait_for()
    assert page.locator("#cancel-job").is_disabled()
    job.refresh_from_db()
    assert job.state == "cancelled"
    shot(page, "cancelled")
    assert not page.js_errors


def test_trends_chart_renders_with_zoom_and_hover_and_flags_the_planted_regression(world, portal_server,
                                                                                    browser_factory, login_cookie,
                                                                                    shot):
    page = open_page(browser_factory, portal_server, login_cookie)
    page.goto(f"/trends/?model={world.model.slug}&hardware={world.history_hardware.slug}")
    page.locator("#trend-ttft_ms[data-rendered=true] canvas").wait_for()
    option = chart_option(page, "trend-ttft_ms")
    assert [s["name"] for s in option["series"]] == ["c=1", "c=4", "c=16", "c=64"]
    flagged_days = {datetime.fromtimestamp(p["coord"][0] / 1000, UTC).date()
                    for s in option["series"] for p in s["markPoint"]["data"]}
    assert world.regression.at.date() in flagged_days
    assert page.locator("#regressions tbody tr", has_text=world.regression.at.strftime("%Y-%m-%d")).count() >= 3
    assert page.locator("#trend-output_tok_s-card").get_attribute("data-flagged") != "0"

    # zoom with the inside data zoom (mouse wheel) and hover for a tooltip
    box = page.locator("#trend-ttft_ms").bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.6, box["y"] + box["height"] * 0.5)
    page.locator("#trend-ttft_ms div", has_text="c=64").first.wait_for()  # the axis tooltip
    page.mouse.wheel(0, -600)
    page.wait_for_function(
        "() => { const z = echarts.getInstanceByDom(document.getElementById('trend-ttft_ms')).getOption().dataZoom[0];"
        " return z.start > 0 || z.end < 100; }")
    shot(page, "desktop")
    phone = open_page(browser_factory, portal_server, login_cookie, phone=True)
    phone.goto(f"/trends/?model={world.model.slug}&hardware={world.history_hardware.slug}")
    phone.locator("#trend-tpot_ms[data-rendered=true] canvas").wait_for()
    shot(phone, "phone")
    assert not page.js_errors and not phone.js_errors


def test_day0_timeline_renders_hours_and_leaderboard(world, portal_server, browser_factory, login_cookie, shot):
    from apps.evidence.ingest import do_record_job_results
    from tests.factories import HardwareFactory, JobFactory
    from tests.portal.reports import bound, passing

    # the world's evidence is synthetic (seeded), which the leaderboard lists apart: one cell of agent evidence
    job = JobFactory(model=world.model, hardware=HardwareFactory(slug="agent-npu", name="AGENT-NPU"),
                     spec={"stages": ["plan", "load"], "dtype": "bfloat16"})
    do_record_job_results(job, bound(job, {"stages": {"plan": passing("plan"), "load": passing("load")}}))
    page = open_page(browser_factory, portal_server, login_cookie)
    page.goto("/day0/")
    page.locator("#leaderboard-chart[data-rendered=true] canvas").wait_for()
    release = page.locator(f'details[data-model="{world.model.slug}"]')
    assert release.locator("tbody tr").count() == 3
    assert " h" in release.locator("tbody tr").first.inner_text()
    assert "synthetic" in page.locator("#unranked").inner_text()  # the seeded cells, listed apart with why
    shot(page, "desktop")
    assert not page.js_errors


def test_another_organizations_user_does_not_see_an_embargoed_model_anywhere(world, portal_server,
                                                                              browser_factory, login_cookie, shot):
    slug, name = world.embargoed.slug, world.embargoed.name
    page = open_page(browser_factory, portal_server, login_cookie, world.viewer)
    for url in ("/", "/day0/", "/trends/"):
        assert page.goto(url).status == 200, url
        body = page.content()
        assert slug not in body and name not in body, url
    shot(page, "viewer-trends")
    for url in ("/export/matrix.csv", "/export/matrix.json", "/api/v1/benchmarks/", "/api/v1/benchmarks/regressions/",
                "/api/v1/matrix/"):  # downloads and JSON, fetched with the page's session
        response = page.request.get(url)
        assert response.status == 200, url
        assert slug not in response.text() and name not in response.text(), url
    for url in (f"/cells/{slug}/{world.hardware.slug}/", f"/badges/{slug}/{world.hardware.slug}.svg",
                f"/trends/?model={slug}&hardware={world.hardware.slug}", f"/api/v1/benchmarks/?model={slug}"):
        assert page.request.get(url).status == 404, url
    from apps.jobs.models import Job

    job = Job.objects.filter(model=world.embargoed).first()
    assert page.goto(f"/jobs/{job.pk}/").status == 404
    insider = open_page(browser_factory, portal_server, login_cookie, world.insider)
    insider.goto("/")
    assert insider.locator(f'tr[data-model="{slug}"]').count() == 1
    assert insider.goto(f"/cells/{slug}/{world.hardware.slug}/").status == 200
    shot(insider, "insider-cell")


def test_matrix_cell_updates_live_when_evidence_arrives(world, portal_server, browser_factory, login_cookie, shot):
    job = JobFactory(model=world.model, hardware=world.other_hardware, organization=world.public_org,
                     spec={"stages": ["plan", "load", "inventory", "align", "serve", "bench", "env", "eval"],
                           "dtype": "bfloat16"})
    agent = make_token(organization=world.public_org, scopes=["agent"], hardware=world.other_hardware,
                       role="admin", name="agent")
    page = open_page(browser_factory, portal_server, login_cookie, world.viewer)
    page.goto("/")
    assert page.locator("script[src$='js/matrix_live.js']").count() == 1
    page.locator("#matrix-live[data-state=live]").wait_for()
    link = page.locator(f'a[href="/cells/{world.model.slug}/{world.other_hardware.slug}/"]')
    before = link.locator(".tier-label").inner_text()
    from tests.portal.reports import passing

    for stage in ("serve",):  # plan and load passed before: serving lifts the cell from 2 to 3
        response = httpx.post(f"{portal_server}/api/v1/jobs/{job.pk}/results/",
                              content=json.dumps({"stage": stage, "section": passing(stage), "attempt": job.attempts,
                                                  "nonce": job.nonce}),
                              headers={"Authorization": f"Token {agent.secret}", "Content-Type": "application/json"},
                              timeout=10)
        assert response.status_code == 201, response.text
    page.wait_for_function(
        "sel => document.querySelector(sel).closest('td').dataset.liveTier !== undefined",
        arg=f'a[href="/cells/{world.model.slug}/{world.other_hardware.slug}/"]')
    after = link.locator(".tier-label").inner_text()
    assert after != before and after.startswith(f'T{response.json()["cell"]["tier"]} ')
    shot(page, "updated")
