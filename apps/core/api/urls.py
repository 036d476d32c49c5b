"""The one versioned router of ``/api/v1/``: each app's ``api/urls.py`` lists its ``routes`` (prefix, viewset,
basename) and any plain ``urlpatterns``."""

from __future__ import annotations

import importlib
from types import ModuleType

from rest_framework.routers import DefaultRouter

API_MODULES: tuple[str, ...] = ("apps.accounts.api.urls", "apps.catalog.api.urls", "apps.fleet.api.urls",
                                "apps.jobs.api.urls", "apps.matrix.api.urls", "apps.benchmarks.api.urls")


def _import(name: str) -> ModuleType | None:
    """The module, or None when its app is not written yet (any other import error is a bug and raises)."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and name.startswith(exc.name):
            return None
        raise


router = DefaultRouter()
urlpatterns: list = []
for _name in API_MODULES:
    _module = _import(_name)
    for prefix, viewset, basename in getattr(_module, "routes", []):
        router.register(prefix, viewset, basename=basename)
    urlpatterns += getattr(_module, "urlpatterns", [])
urlpatterns += router.urls
