from __future__ import annotations

from django.urls import path

from apps.matrix.api.views import CellDetailView, MatrixView

routes: list = []
urlpatterns = [
    path("matrix/", MatrixView.as_view(), name="matrix"),
    path("cells/<str:model>/<str:hardware>/", CellDetailView.as_view(), name="cell"),
]
