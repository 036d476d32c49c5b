"""The matrix at scale in a real Chromium: one page of rows with a pager, a search that finds a model on any page
without a reload, and live updates that change an on-screen cell and leave a model on another page alone."""

from __future__ import annotations

import pytest

from apps.catalog.models import ModelRelease
from apps.matrix.events import CellChangedMessage, broadcast_cell_changed
from tests.browser.pages import open_page
from tests.factories import UserFactory
from tests.portal.bulk import build_matrix

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def _changed(model: str, hardware: str, tier: int, name: str) -> CellChangedMessage:
    return CellChangedMessage(type="cell.changed", model=model, hardware=hardware, tier=tier, tier_name=name,
                              failed_stage="", fits=True, fits_devices=1, custom_thresholds=False, synthetic=False,
                              disputed=[])


def test_pages_search_and_live_updates_across_pages(portal_server, browser_factory, login_cookie, shot):
    build_matrix(45, 4, 0, tag="br")
    slugs = list(ModelRelease.objects.values_list("slug", flat=True))  # newest release first
    page = open_page(browser_factory, portal_server, login_cookie, UserFactory())
    page.goto("/")
    rows = page.locator("table#matrix tbody tr")
    assert rows.count() == 20 and rows.first.get_attribute("data-model") == slugs[0]
    assert page.locator("#matrix-count").inner_text() == "45 of 45 models × 4 hardware"
    assert "page 1 of 3" in page.locator(".matrix-pager").first.inner_text()
    page.locator("#matrix-live[data-state=live]").wait_for()

    # a change to a model on another page: nothing breaks, nothing on screen changes
    broadcast_cell_changed(_changed(slugs[-1], "br-hw-0", 6, "validated"))
    page.wait_for_function("document.getElementById('matrix-live').textContent.includes('another page')")
    assert page.locator("td[data-live-tier]").count() == 0
    # an on-screen cell updates in place
    broadcast_cell_changed(_changed(slugs[0], "br-hw-1", 5, "benchmarked"))
    cell = page.locator(f'a[href="/cells/{slugs[0]}/br-hw-1/"]')
    page.wait_for_function(f"document.querySelector('a[href=\"/cells/{slugs[0]}/br-hw-1/\"]')"
                           ".closest('td').dataset.liveTier === '5'")
    assert cell.locator(".tier-label").inner_text() == "T5 benchmarked"
    shot(page, "page-1")

    page.locator("a[rel=next]").first.click()
    page.wait_for_url("**page=2**")
    assert [r.get_attribute("data-model") for r in page.locator("table#matrix tbody tr").all()] == slugs[20:40]

    oldest = ModelRelease.objects.get(slug=slugs[-1])  # on page 3: the search finds it from page 2, no reload
    page.evaluate("window.stillHere = true")
    page.fill("#matrix-search", oldest.name)
    page.wait_for_function("location.search.includes('q=')")
    assert [r.get_attribute("data-model") for r in page.locator("table#matrix tbody tr").all()] == [oldest.slug]
    assert page.locator("#matrix-count").inner_text() == "1 of 45 models × 4 hardware"
    assert page.evaluate("window.stillHere === true") and "page=" not in page.url
    # live updates still reach the grid the search put in place
    broadcast_cell_changed(_changed(oldest.slug, "br-hw-2", 4, "aligned"))
    page.wait_for_function(f"document.querySelector('a[href=\"/cells/{oldest.slug}/br-hw-2/\"]')"
                           ".closest('td').dataset.liveTier === '4'")
    page.fill("#matrix-search", "")
    page.wait_for_function("document.querySelectorAll('table#matrix tbody tr').length === 20")
    shot(page, "searched")
    assert not page.js_errors
