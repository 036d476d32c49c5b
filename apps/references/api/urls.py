from __future__ import annotations

from django.urls import path

from apps.references.api.views import ReferenceView

routes: list = []
urlpatterns = [path("models/<str:slug>/reference/", ReferenceView.as_view(), name="model-reference")]
