from __future__ import annotations

from django.urls import path

from apps.benchmarks.api.views import BenchmarkSeriesView, RegressionListView

routes: list = []
urlpatterns = [
    path("benchmarks/", BenchmarkSeriesView.as_view(), name="benchmark-series"),
    path("benchmarks/regressions/", RegressionListView.as_view(), name="benchmark-regressions"),
]
