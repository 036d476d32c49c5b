from __future__ import annotations

from django.apps import AppConfig


class OpsConfig(AppConfig):
    """The portal's operations surface: Prometheus metrics at ``/metrics`` and OpenTelemetry traces."""

    name = "apps.ops"
    label = "ops"

    def ready(self) -> None:
        from apps.ops import receivers  # noqa: F401 (tier changes, Celery tasks)
        from apps.ops import tracing as portal_tracing  # noqa: F401 (the dispatch span in the message headers)
        from telemetry import tracing

        tracing.configure("day0-portal")  # DAY0_TRACING_EXPORTER: off (a no-op tracer) unless it names one
