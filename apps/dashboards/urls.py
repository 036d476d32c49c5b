from __future__ import annotations

from django.urls import path

from apps.dashboards import views

urlpatterns = [
    path("cells/<str:model>/<str:hardware>/", views.cell_page, name="cell-page"),
    path("jobs/<int:job_id>/", views.job_page, name="job-page"),
    path("trends/", views.trends_page, name="trends-page"),
    path("day0/", views.day0_page, name="day0-page"),
    path("badges/<str:model>/<str:hardware>.svg", views.badge, name="cell-badge"),
    path("export/matrix.<str:fmt>", views.export_matrix, name="matrix-export"),
]
