"""The one versioned router of ``/api/v1/``: each app's ``api/urls.py`` lists its ``routes`` (prefix, viewset,
basename) and any plain ``urlpatterns``."""

from __future__ import annotations

import importlib

from apps.core.api.root import PortalRouter

API_MODULES: tuple[str, ...] = ("apps.accounts.api.urls", "apps.catalog.api.urls", "apps.fleet.api.urls",
                                "apps.jobs.api.urls", "apps.matrix.api.urls", "apps.benchmarks.api.urls",
                                "apps.alerts.api.urls", "apps.references.api.urls",
                                "apps.evidence.api.urls")


router = PortalRouter()
urlpatterns: list = []
for _name in API_MODULES:
    _module = importlib.import_module(_name)
    for prefix, viewset, basename in getattr(_module, "routes", []):
        router.register(prefix, viewset, basename=basename)
    urlpatterns += getattr(_module, "urlpatterns", [])
urlpatterns += router.urls
