from __future__ import annotations

from django.urls import path

from apps.matrix import views

urlpatterns = [
    path("", views.matrix_page, name="matrix-page"),
    path("cells/<str:model>/<str:hardware>/", views.cell_page, name="cell-page"),
]
