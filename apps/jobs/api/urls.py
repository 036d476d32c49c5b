from __future__ import annotations

from apps.jobs.api.views import JobViewSet

routes = [("jobs", JobViewSet, "job")]
urlpatterns: list = []
