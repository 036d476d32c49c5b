"""Helpers of the browser tests: a page in a fresh Chromium context that records the page's JavaScript errors."""

from __future__ import annotations


def open_page(browser_factory, portal_server, login_cookie, user=None, *, phone: bool = False):  # noqa: ANN001, ANN201
    """A page at 1280 px (or 390 px with ``phone``), signed in as ``user`` when given; ``page.js_errors`` lists
    uncaught errors."""
    context = browser_factory(portal_server, session_cookie=login_cookie(user) if user else None, phone=phone)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.js_errors = errors
    return page
