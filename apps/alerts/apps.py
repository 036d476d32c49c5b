from __future__ import annotations

from django.apps import AppConfig


class AlertsConfig(AppConfig):
    name = "apps.alerts"
    label = "alerts"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from apps.alerts import receivers  # imports models: only once the app registry is ready

        receivers.connect()
