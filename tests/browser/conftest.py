"""Browser test harness: Debian's Chromium driven by Playwright against the real ASGI app.

pytest-django's ``live_server`` is WSGI and serves no WebSockets, so ``portal_server`` runs
``uvicorn day0portal.asgi:application`` in a subprocess against the test database (PostgreSQL: the
subprocess and the test share committed rows, hence ``transactional_db``) and the Redis channel layer.
One Chromium per test module; each context a test opens is a fresh profile (a new browser context: no cookies,
storage or cache from another). ``db_snapshots`` (tests/conftest.py) builds a test's rows once per session and
copies them back for the next test that asks. ``shot(page, name)`` saves a screenshot under
``test-artifacts/screenshots/``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.error import URLError
from urllib.request import urlopen

import pytest
from django.conf import settings

from tests.live_services import database_url, free_port

# Playwright's sync API keeps an event loop running in the test thread; Django's ORM calls from the test
# itself (factories, assertions) are still synchronous and safe (the documented pytest-playwright setting).
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "test-artifacts" / "screenshots"
CHROMIUM = os.environ.get("DAY0_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 900}


@pytest.fixture(scope="session")
def portal_server(django_db_setup, django_db_blocker) -> Iterator[str]:
    """Base URL of uvicorn serving the ASGI app (HTTP and WebSocket) on the test database."""
    if not os.environ.get("DAY0_REDIS_URL"):
        pytest.fail("browser tests need Redis for the channel layer: set DAY0_REDIS_URL=redis://… (see `make test`)")
    if not (ROOT / "static" / "vendor" / "echarts" / "echarts.min.js").exists():
        built = subprocess.run([str(ROOT / "scripts" / "build_static.sh")], capture_output=True, text=True)
        if built.returncode != 0:
            pytest.fail(f"static/vendor is missing and scripts/build_static.sh failed:\n{built.stderr[-2000:]}")
    port = free_port()
    env = {**os.environ, "DAY0_DATABASE_URL": database_url("browser tests"), "PYTHONUNBUFFERED": "1",
           "DJANGO_SETTINGS_MODULE": "day0portal.settings"}
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)  # the server keeps Django's async safety checks
    log_path = ROOT / "test-artifacts" / "portal-server.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = log_path.open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "day0portal.asgi:application",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "warning",
            "--no-access-log",
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            pytest.fail(f"portal server exited with {proc.returncode}; see {log_path}:\n{log_path.read_text()[-3000:]}")
        try:
            with urlopen(f"{base}/healthz", timeout=2) as r:
                if r.status == 200:
                    break
        except (URLError, ConnectionError, TimeoutError):
            pass
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"portal server did not answer /healthz within 60 s; see {log_path}")
        time.sleep(0.2)
    try:
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture(scope="module")
def playwright_driver() -> Iterator[object]:
    """Per module: Playwright's sync API marks an asyncio loop as running on the main thread while it is open,
    which would break ``asyncio.run`` in every test collected after the browser tests."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: run scripts/install_chromium.sh")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        yield p


@pytest.fixture(scope="module")
def chromium(playwright_driver) -> Iterator[object]:
    """One headless Chromium per module (starting one takes about a second); tests get fresh contexts in it."""
    browser = playwright_driver.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
    yield browser
    browser.close()


@pytest.fixture
def browser_factory(chromium) -> Iterator[Callable[..., object]]:
    """Opens a fresh Chromium context (its own empty profile); ``session_cookie`` logs it in; closed at teardown."""
    contexts: list[object] = []

    def open_context(base_url: str, *, session_cookie: str | None = None, phone: bool = False):
        context = chromium.new_context(viewport=PHONE if phone else DESKTOP, base_url=base_url,
                                       service_workers="block")
        context.set_default_timeout(30_000)  # a shared 2-core machine: be patient, not flaky
        if session_cookie:
            context.add_cookies([{"name": settings.SESSION_COOKIE_NAME, "value": session_cookie, "url": base_url}])
        contexts.append(context)
        return context

    yield open_context
    for context in contexts:
        context.close()


@pytest.fixture
def login_cookie(transactional_db) -> Callable[[object], str]:
    """A session cookie value for a user, made through Django's test client (session stored in the database)."""
    from django.test import Client

    def make(user) -> str:
        client = Client()
        client.force_login(user)
        return client.cookies[settings.SESSION_COOKIE_NAME].value

    return make


@pytest.fixture
def shot(request) -> Callable[..., Path]:
    """Saves a full-page screenshot named after the test (and a suffix)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)

    def save(page, suffix: str = "") -> Path:
        name = request.node.name.replace("[", "-").replace("]", "").replace("/", "-")
        path = SCREENSHOTS / f"{name}{'-' + suffix if suffix else ''}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return save
