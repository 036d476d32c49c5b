"""Round-2 pages in a real Chromium against the ASGI server on PostgreSQL and Redis, at 1280 and 390 px: the matrix
at a glance (whole catalog without sideways scrolling, search and filters that apply as they change), the run
form end to end, the jobs, model, hardware and fleet pages, regressions and the comparison of two runs."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.fleet.models import Agent
from apps.jobs.models import Job
from tests.agents.conftest import portal, start_agent  # noqa: F401 - the real agent fixtures, for the slow test
from tests.agents.test_job_flow import cell  # noqa: F401 - a tiny MoE release, its hardware, tokens, models dir
from tests.browser.pages import open_page
from tests.dashboards.world import build_world

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

NO_SIDEWAYS = "document.documentElement.scrollWidth <= window.innerWidth"
WIDEST = """(() => Array.from(document.querySelectorAll('body *')).filter(e => e.getBoundingClientRect().right >
  window.innerWidth + 1).slice(0, 8).map(e => e.tagName + '.' + e.className + '#' + e.id + ' ' +
  Math.round(e.getBoundingClientRect().right)))()"""


def fits_width(page) -> bool:  # noqa: ANN001
    """The page never scrolls sideways (the offending elements in the failure message)."""
    assert page.evaluate(NO_SIDEWAYS), page.evaluate(WIDEST)
    return True


@pytest.fixture
def world(transactional_db, db_snapshots):  # noqa: ANN001, ANN201
    # the planted regression is the newest run: still open
    return db_snapshots.restore_or_build("open_regression_world", lambda: build_world(regression_days_ago=1))


def test_the_seeded_matrix_fits_1280_px_and_filters_as_you_type(transactional_db, portal_server, browser_factory,
                                                                  login_cookie, shot):
    from apps.catalog.models import Hardware, ModelRelease
    from apps.catalog.seed import seed_catalog

    seed_catalog()  # the bundled catalog: ~11 models × 10 hardware (with this host)
    page = open_page(browser_factory, portal_server, login_cookie)
    page.goto("/")
    page.locator("table#matrix").wait_for()
    assert page.locator("table#matrix thead th").count() == Hardware.objects.count() + 1
    assert fits_width(page)
    wrap = page.evaluate("(() => { const w = document.querySelector('.matrix-wrap'); "
                         "return [w.scrollWidth, w.clientWidth]; })()")
    assert wrap[0] <= wrap[1], wrap  # every hardware column visible, no box scrolling sideways
    last = page.locator("table#matrix thead th").last.bounding_box()
    assert last["x"] + last["width"] <= 1280
    deepseek = page.locator('a[href="/cells/deepseek-v3/nvidia-h200/"]')
    # the checkpoint's own format, shown; block FP8 runs dequantised (the runtime has no blockwise FP8 matmul)
    assert deepseek.inner_text() == "fits 8× · FP8 emulated"
    assert "float8_e4m3fn" in deepseek.locator("xpath=..").get_attribute("title")
    shot(page, "1280")
    page.fill("#matrix-search", "llama")  # applies as you type, no reload, and stays in the URL
    page.wait_for_function("location.search.includes('q=llama')")
    shown = page.locator("table#matrix tbody tr:not([hidden])")
    assert shown.count() == ModelRelease.objects.filter(family="llama").count() > 0
    assert all("Llama" in name for name in shown.locator(".model-name").all_inner_texts())
    page.reload()
    assert page.locator("table#matrix tbody tr:not([hidden])").count() == shown.count()  # from the URL
    page.select_option("select[name=dtype]", "bfloat16")  # a select applies without a click
    page.wait_for_url("**dtype=bfloat16**")
    assert page.locator('a[href="/cells/llama-3.1-8b/nvidia-h100-sxm/"]').inner_text() == "fits 1× · bf16"
    assert page.locator('#export-csv').get_attribute("href").startswith("/export/matrix.csv")
    shot(page, "1280-searched")
    phone = open_page(browser_factory, portal_server, login_cookie, phone=True)
    phone.goto("/")
    phone.locator("table#matrix").wait_for()
    assert fits_width(phone)  # the page itself never scrolls sideways; the matrix box does
    header = phone.locator("table#matrix thead th.model-col")
    phone.locator(".matrix-wrap").evaluate("w => { w.scrollLeft = 400; w.scrollTop = 200; }")
    assert header.bounding_box()["x"] < 40  # the model column stays put
    shot(phone, "390")
    assert not page.js_errors and not phone.js_errors


def test_run_form_creates_a_job_and_shows_the_cli_and_curl_as_it_changes(world, portal_server, browser_factory,
                                                                         login_cookie, shot):
    page = open_page(browser_factory, portal_server, login_cookie, world.viewer)
    page.goto(f"/cells/{world.model.slug}/{world.other_hardware.slug}/")
    page.click("#run summary")
    assert page.locator("#no-agent").is_visible()
    page.uncheck("#run-form input[name=stages][value=bench]")
    page.select_option("#run-form select[name=preset]", "strict")
    page.fill("#run-form input[name=tp]", "1")
    page.wait_for_function("document.getElementById('run-curl').textContent.includes('\"tp\":1')")
    cli = page.locator("#run-cli").inner_text()
    assert "--stages plan,load,inventory,align,serve,env" in cli and f"--hardware {world.other_hardware.slug}" in cli
    curl = page.locator("#run-curl").inner_text()
    assert '"layer_cosine":0.999' in curl and "/api/v1/jobs/" in curl
    shot(page, "1280-form")
    before = Job.objects.count()
    page.click("#run-form button[type=submit]")
    page.wait_for_url(re.compile(r".*/jobs/\d+/$"))
    job = Job.objects.latest("id")
    assert Job.objects.count() == before + 1 and page.url.endswith(f"/jobs/{job.pk}/")
    assert job.spec["tp"] == 1 and "bench" not in job.spec["stages"] and job.spec["thresholds"]["op_cosine"] == 0.9999
    assert page.locator("#no-agent").is_visible()  # nobody serves hw.<slug>: said, not an empty log for ever
    shot(page, "1280-job-waiting")
    # a bad value comes back with the field named and the form as typed
    page.goto(f"/cells/{world.model.slug}/{world.other_hardware.slug}/")
    page.click("#run summary")
    page.fill("#run-form input[name=pp]", "0")
    page.click("#run-form button[type=submit]")
    page.locator("#run-errors").wait_for()
    assert "pp" in page.locator("#run-errors").inner_text()
    assert page.locator("#run-form input[name=pp]").input_value() == "0"
    assert Job.objects.count() == before + 1
    phone = open_page(browser_factory, portal_server, login_cookie, world.viewer, phone=True)
    phone.goto(f"/cells/{world.model.slug}/{world.other_hardware.slug}/")
    phone.click("#run summary")
    assert fits_width(phone)
    shot(phone, "390-form")
    assert not page.js_errors and not phone.js_errors


@pytest.mark.parametrize("phone", [False, True], ids=["1280", "390"])
def test_jobs_model_hardware_and_fleet_pages(world, portal_server, browser_factory, login_cookie, shot, phone):
    Agent.objects.create(hardware=world.hardware, hostname="gpu-node-1", last_heartbeat_at=timezone.now(),
                         versions={"torch": "2.13.0", "runtime": "abc123"})
    Agent.objects.create(hardware=world.other_hardware, hostname="gpu-node-2",
                         last_heartbeat_at=timezone.now() - timedelta(hours=3))
    page = open_page(browser_factory, portal_server, login_cookie, world.viewer, phone=phone)
    page.goto("/jobs/")
    rows = page.locator("#jobs-table tbody tr")
    assert rows.count() > 5 and fits_width(page)
    assert page.locator('nav a[aria-current="page"]').inner_text() == "Jobs"
    shot(page, "jobs")
    page.select_option("#job-filters select[name=state]", "failed")  # applies without a click
    page.wait_for_url("**state=failed**")
    states = page.locator("#jobs-table tbody tr .job-state").all_inner_texts()
    assert states and all("failed" in s for s in states)
    page.goto(f"/models/{world.model.slug}/")
    for part in ("#parameters", "#config", "#cells", "#timeline .time-axis"):
        assert page.locator(part).is_visible(), part
    assert page.locator("#timeline .ta-mark").count() >= 2 and fits_width(page)
    shot(page, "model")
    page.goto(f"/hardware/{world.hardware.slug}/")
    assert page.locator("#agents", has_text="gpu-node-1").is_visible() and fits_width(page)
    assert "torch 2.13.0" in page.locator("#agents").inner_text()
    shot(page, "hardware")
    page.goto("/agents/")
    assert page.locator("#agents-table tbody tr").count() == 2 and fits_width(page)
    assert "○ offline" in page.locator('tr[data-agent="gpu-node-2"]').inner_text()
    shot(page, "agents")
    assert not page.js_errors


@pytest.mark.parametrize("phone", [False, True], ids=["1280", "390"])
def test_regressions_lead_to_the_side_by_side_comparison(world, portal_server, browser_factory, login_cookie, shot,
                                                         phone):
    page = open_page(browser_factory, portal_server, login_cookie, world.viewer, phone=phone)
    page.goto("/")
    flagged = page.locator(f'a[href="/cells/{world.model.slug}/{world.history_hardware.slug}/"] .reg-open')
    assert flagged.count() == 1  # the matrix flags the open regression
    page.goto("/regressions/")
    rows = page.locator("#regressions-table tbody tr.regression-row")
    assert rows.count() >= 3 and fits_width(page)
    assert rows.first.locator(".reg-open").count() == 1  # newest first, and still open
    shot(page, "regressions")
    page.check("#regression-filters input[name=open]")
    page.wait_for_url("**open=1**")
    rows.first.locator("a.compare-link").click()
    page.wait_for_url("**/compare/?a=*")
    for part in ("#side-a", "#side-b", "#compare-bench", "#compare-stages"):
        assert page.locator(part).is_visible(), part
    assert page.locator("#compare-bench tr.cmp-worse").count() > 0  # the regression shows as worse, B vs A
    assert fits_width(page)
    shot(page, "compare")
    # the job page and the cell's job history lead there too
    b = int(re.search(r"b=(\d+)", page.url).group(1))
    page.goto(f"/jobs/{b}/")
    page.locator("#compare-previous").click()
    page.wait_for_url(f"**/compare/?a=*&b={b}")
    page.goto(f"/cells/{world.model.slug}/{world.history_hardware.slug}/")
    assert page.locator("#jobs a.compare-link").count() >= 1
    assert page.locator("#cell-regressions").is_visible()
    page.goto("/trends/")  # opens on the newest regression's cell
    assert page.locator("#cell-select").input_value() == f"{world.model.slug}|{world.history_hardware.slug}"
    assert not page.js_errors


@pytest.mark.slow
def test_a_job_submitted_from_the_form_runs_on_a_real_agent_and_the_matrix_cell_changes(
        portal, start_agent, cell, browser_factory, login_cookie, shot):  # noqa: ANN001, F811
    """The whole chain from the browser: form → check_create_job → Celery queue → ``day0 agent`` → pipeline →
    results → the matrix cell, updated live over the WebSocket."""
    from tests.agents.conftest import wait_for

    model, hardware, user = cell.model, cell.hardware, cell.submit.user  # a submitter of the model's organization
    agent = start_agent(hardware.slug, cell.agent.secret, models_dir=cell.models_dir)

    matrix = open_page(browser_factory, portal.url, login_cookie, user)
    matrix.goto("/")
    matrix.locator("#matrix-live[data-state=live]").wait_for()
    cell = matrix.locator(f'a[href="/cells/{model.slug}/{hardware.slug}/"]')
    assert cell.locator(".tier-label").count() == 0  # untested: only its fit
    form = open_page(browser_factory, portal.url, login_cookie, user)
    form.goto(f"/cells/{model.slug}/{hardware.slug}/")
    form.click("#run summary")
    for stage in ("align", "serve", "bench"):
        form.uncheck(f"#run-form input[name=stages][value={stage}]")
    form.select_option("#run-form select[name=dtype]", "float32")
    form.click("#run-form button[type=submit]")
    form.wait_for_url(re.compile(r".*/jobs/\d+/$"))
    job_id = int(re.search(r"/jobs/(\d+)/", form.url).group(1))
    wait_for(lambda: Job.objects.get(pk=job_id).state in ("succeeded", "failed"), 300, "the job to finish", agent)
    assert Job.objects.get(pk=job_id).state == "succeeded", agent.log()
    form.locator("#ws-status.ended", has_text="succeeded").wait_for()  # the end state, not "live"
    matrix.wait_for_function(
        "sel => document.querySelector(sel).closest('td').dataset.liveTier >= '2'",
        arg=f'a[href="/cells/{model.slug}/{hardware.slug}/"]', timeout=60_000)
    assert cell.locator(".tier-label").inner_text().startswith("T2 ")
    shot(matrix, "matrix-after")
    shot(form, "job-finished")


@pytest.fixture
def runtime_evidence(transactional_db):  # noqa: ANN001, ANN201
    """A MoE cell with a benchmark history (comm overhead per rank, jitter, expert balance), its newest job on
    the compiled path (serve, align and bench compile blocks), a soak with device memory and a two-node job."""
    from apps.evidence.services import do_record_stage_results
    from apps.fleet.models import StackChange
    from apps.jobs.models import JobNode
    from tests.factories import JobFactory
    from tests.portal.reports import passing
    from tests.portal.test_cell_runtime_evidence import BENCH_COMPILE, SERVE_COMPILE, SOAK, _align_compile, _bench
    from tests.portal.test_trend_run_metrics import _history

    model, hardware, start = _history()
    change = StackChange.objects.create(hardware=hardware, before={"torch": "2.12.0"}, after={"torch": "2.13.0"},
                                        changed=["torch"])
    StackChange.objects.filter(pk=change.pk).update(created_at=start + timedelta(days=3, hours=1))
    job = JobFactory(model=model, hardware=hardware, nodes=2, state="succeeded",
                     spec={"stages": ["serve", "align", "bench", "soak"], "dtype": "bfloat16",
                           "bench": {"compile": True}})
    windows = [{"t": 10.0 * i, "output_tok_s": 50.0 - i % 2, "rss_bytes": 900_000_000 + 1_000_000 * i,
                "device_allocated_bytes": 2_000_000_000 + 4_000_000 * i + 1_000_000 * (i % 3),
                "device_max_allocated_bytes": 2_100_000_000, "outage": False} for i in range(1, 9)]
    do_record_stage_results(job, {
        "serve": {**passing("serve"), "compile": SERVE_COMPILE},
        "align": {**passing("align"), "compile": _align_compile(diverge=True)},
        "bench": {**_bench(moe=True), "compile": BENCH_COMPILE},
        "soak": {**SOAK, "windows": windows, "device_memory": {"source": "torch.cuda",
                                                                "memory_slope": 4000.0}}})
    agents = [Agent.objects.create(hardware=hardware, hostname=f"gpu-host-{i}") for i in range(2)]
    for rank, agent in enumerate(agents):
        JobNode.objects.create(job=job, attempt=1, rank=rank, agent=agent, master_addr="10.0.0.1",
                               master_port=31000, state="finished", claimed_at=timezone.now() - timedelta(minutes=9),
                               finished_at=timezone.now())
    return model, hardware, job


@pytest.mark.parametrize("phone", [False, True], ids=["1280", "390"])
def test_the_runtime_evidence_on_the_cell_trends_and_job_pages(runtime_evidence, portal_server, browser_factory,
                                                               login_cookie, shot, phone):
    model, hardware, job = runtime_evidence
    page = open_page(browser_factory, portal_server, login_cookie, phone=phone)
    page.goto(f"/cells/{model.slug}/{hardware.slug}/")
    for part in ("#compiled-serve", "#compiled-bench", "#compiled-align", "#bench-extras", "#soak-device-memory"):
        assert page.locator(part).is_visible(), part
    assert page.locator("#compiled-speedup").inner_text() == "1.40×"
    assert page.locator("#bench-extras tbody tr").count() == 3
    assert page.locator("#bench-extras svg.expert-bars rect").count() == 24  # 8 experts, 3 runs
    first = page.locator('#bench-extras tr[data-concurrency="1"]')
    assert first.locator(".comm").inner_text().strip() == "4.0 %" and "9.0 %" in first.locator(".comm-ranks").inner_text()
    assert "cuda" in page.locator("#soak-device-note").inner_text()
    assert fits_width(page)
    page.locator("#bench-extras").scroll_into_view_if_needed()
    shot(page, "cell")
    page.goto(f"/trends/?model={model.slug}&hardware={hardware.slug}")
    page.locator("#trend-comm_overhead_ratio[data-rendered=true] canvas").wait_for()
    for family in ("comm_overhead_ratio_max", "tpot_jitter", "expert_max_over_mean", "expert_ep_max_over_mean"):
        assert page.locator(f"#trend-{family}[data-rendered=true] canvas").count() == 1, family
    marks = page.evaluate("() => echarts.getInstanceByDom(document.getElementById('trend-comm_overhead_ratio'))"
                          ".getOption().series[0].markLine.data.map(d => d.what)")
    assert marks == ["torch 2.13.0"]  # the stack change on the time axis
    assert page.locator("#trend-comm_overhead_ratio-card").get_attribute("data-flagged") == "3"
    assert fits_width(page)
    shot(page, "trends")
    page.goto(f"/jobs/{job.pk}/")
    rows = page.locator("#job-nodes tbody tr")
    assert rows.count() == 2 and "gpu-host-1" in rows.nth(1).inner_text()
    assert rows.nth(0).locator(".node-state").inner_text() == "finished"
    assert fits_width(page)
    shot(page, "job")
    assert not page.js_errors
