from __future__ import annotations

from django.urls import path

from apps.evidence.api.views import JobResultsView, SettleManifestView

routes: list = []
urlpatterns = [path("jobs/<str:pk>/results/", JobResultsView.as_view(), name="job-results"),
               path("models/<str:slug>/manifest/settle/", SettleManifestView.as_view(), name="model-manifest-settle")]
