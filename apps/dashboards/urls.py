from __future__ import annotations

from django.urls import path
from django.views.generic import RedirectView

from apps.dashboards import views

urlpatterns = [
    path("cells/<str:model>/<str:hardware>/", views.cell_page, name="cell-page"),
    path("cells/<str:model>/<str:hardware>/run/", views.run_adaptation, name="cell-run"),
    path("jobs/", views.jobs_page, name="jobs-page"),
    path("jobs/<int:job_id>/", views.job_page, name="job-page"),
    path("models/<str:slug>/", views.model_page, name="model-page"),
    path("hardware/", views.hardware_list, name="hardware-list"),
    path("hardware/<str:slug>/", views.hardware_page, name="hardware-page"),
    path("agents/", views.agents_page, name="agents-page"),
    path("regressions/", views.regressions_page, name="regressions-page"),
    path("compare/", views.compare_page, name="compare-page"),
    path("trends/", views.trends_page, name="trends-page"),
    path("day0/", views.day0_page, name="day0-page"),
    path("badges/<str:model>/<str:hardware>.svg", views.badge, name="cell-badge"),
    path("export/matrix.<str:fmt>", views.export_matrix, name="matrix-export"),
    path("favicon.ico", RedirectView.as_view(url="/static/img/favicon.svg", permanent=True)),
]
