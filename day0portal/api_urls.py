"""The one versioned router of ``/api/v1/``: each app's ``api/urls.py`` lists its ``routes`` (prefix, viewset,
basename) and any plain ``urlpatterns``. Composed here, in the Django project, above every app."""

from __future__ import annotations

from types import ModuleType

from apps.accounts.api import urls as accounts_urls
from apps.alerts.api import urls as alerts_urls
from apps.benchmarks.api import urls as benchmarks_urls
from apps.catalog.api import urls as catalog_urls
from apps.core.api.root import PortalRouter
from apps.evidence.api import urls as evidence_urls
from apps.fleet.api import urls as fleet_urls
from apps.jobs.api import urls as jobs_urls
from apps.matrix.api import urls as matrix_urls
from apps.references.api import urls as references_urls

API_MODULES: tuple[ModuleType, ...] = (accounts_urls, catalog_urls, fleet_urls, jobs_urls, matrix_urls,
                                       benchmarks_urls, alerts_urls, references_urls, evidence_urls)

router = PortalRouter()
urlpatterns: list = []
for _module in API_MODULES:
    for prefix, viewset, basename in getattr(_module, "routes", []):
        router.register(prefix, viewset, basename=basename)
    urlpatterns += getattr(_module, "urlpatterns", [])
urlpatterns += router.urls
