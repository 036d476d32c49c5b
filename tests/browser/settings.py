"""Settings of the browser tests' portal subprocess: the project's settings, plus the dashboards' URLs while
``day0portal/urls.py`` does not include them yet (see tests/dashboards/urls.py)."""

from __future__ import annotations

from day0portal.settings import *  # noqa: F403
from day0portal.settings import BASE_DIR

if "apps.dashboards.urls" not in (BASE_DIR / "day0portal" / "urls.py").read_text():
    ROOT_URLCONF = "tests.dashboards.urls"
