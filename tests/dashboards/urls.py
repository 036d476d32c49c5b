"""Test URLconf used only while ``day0portal/urls.py`` does not include the dashboards yet: the dashboard pages
and the benchmark API first (so ``/cells/`` is the full evidence page), then the project's own map."""

from __future__ import annotations

from django.urls import include, path

urlpatterns = [
    path("", include("apps.dashboards.urls")),
    path("api/v1/", include("apps.benchmarks.api.urls")),
    path("", include("day0portal.urls")),
]
