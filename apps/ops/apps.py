from __future__ import annotations

from django.apps import AppConfig


class OpsConfig(AppConfig):
    """The portal's operations surface: Prometheus metrics at ``/metrics`` and OpenTelemetry traces."""

    name = "apps.ops"
    label = "ops"

    def ready(self) -> None:
        from apps.ops import receivers  # noqa: F401 (tier changes, Celery tasks)
