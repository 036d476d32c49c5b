"""WebSocket routes of the matrix (collected by ``day0portal/asgi.py``)."""

from __future__ import annotations

from django.urls import path

from apps.matrix.consumers import MatrixConsumer

websocket_urlpatterns = [
    path("ws/matrix/", MatrixConsumer.as_asgi()),
]
