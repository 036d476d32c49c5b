"""Engines on the matrix in a real Chromium: a model × hardware with the bundled runtime and vLLM shows the best
engine's tier with the other listed, the engine filter switches the grid, the cell page lists both engines and
links them side by side, and the compare page names the version-lock entries that differ."""

from __future__ import annotations

import pytest

from apps.catalog.engines import ensure_builtin_engines
from tests.browser.pages import open_page
from tests.factories import HardwareFactory, ModelReleaseFactory, UserFactory
from tests.portal.engine_runs import run_job, spec, vllm_serve
from tests.portal.reports import TIER_STAGES, passing

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_matrix_engine_filter_cell_engines_and_compare(portal_server, browser_factory, login_cookie, shot):
    ensure_builtin_engines()
    model, hardware = ModelReleaseFactory(slug="eng-model"), HardwareFactory(slug="eng-hw")
    run_job(model, hardware, {s: passing(s) for s in TIER_STAGES[2]} | {"env": passing("env")})
    run_job(model, hardware, {**{s: passing(s) for s in TIER_STAGES[2]}, "serve": vllm_serve("0.32.0", "8"),
                              "env": passing("env")}, spec("vllm", "0.32.0"))
    page = open_page(browser_factory, portal_server, login_cookie, UserFactory())
    page.goto("/")
    cell = page.locator('table#matrix td[data-engine="vllm@0.32.0"]')
    assert cell.locator(".tier-label").inner_text() == "T3 serves"
    assert cell.locator(".engine").inner_text() == "vllm@0.32.0 +1"
    assert "engines: vllm@0.32.0 T3, day0 T2" in cell.get_attribute("title")
    shot(page, "best-engine")

    page.select_option("#matrix-engine", "day0")  # autosubmit: the grid of the bundled runtime's cells
    page.wait_for_url("**engine=day0**")
    day0 = page.locator('table#matrix a[href="/cells/eng-model/eng-hw/"]')
    assert day0.locator(".tier-label").inner_text() == "T2 loads"
    assert page.locator('table#matrix td[data-engine="vllm@0.32.0"]').count() == 0

    page.goto("/")
    page.locator('table#matrix td[data-engine="vllm@0.32.0"] a').click()
    page.wait_for_url("**/cells/eng-model/eng-hw/?engine=vllm%400.32.0")
    rows = page.locator("#cell-engines tbody tr")
    assert [r.get_attribute("data-engine") for r in rows.all()] == ["vllm@0.32.0", "day0"]
    assert page.locator("#cell-engines tr.current").get_attribute("data-engine") == "vllm@0.32.0"
    shot(page, "cell-engines")

    page.locator("#cell-engines a.compare-engines").first.click()
    page.wait_for_url("**/compare/**")
    assert "vllm@0.32.0" in page.locator("#compare-engines").inner_text()
    differs = page.locator("#compare-lock .lock-differs").inner_text()
    assert "engine.name" in differs and "engine.command" in differs and "engine.env.OMP_NUM_THREADS" in differs
    assert "package.torch" not in differs  # the same torch on both runs
    assert page.locator("#compare-lock tr.cmp-differs").count() >= 3
    shot(page, "compare-lock")
    assert page.js_errors == []
