"""WebSocket routes (collected by ``day0portal/asgi.py``)."""

from __future__ import annotations

from django.urls import path

from apps.jobs.consumers import JobEventsConsumer

websocket_urlpatterns = [
    path("ws/jobs/<int:job_id>/", JobEventsConsumer.as_asgi()),
]
