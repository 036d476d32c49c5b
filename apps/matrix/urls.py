from __future__ import annotations

from django.urls import path

from apps.matrix import views

# The cell page lives in apps.dashboards (/cells/<model>/<hardware>/): the matrix links there.
urlpatterns = [
    path("", views.matrix_page, name="matrix-page"),
]
