from __future__ import annotations

from django.apps import AppConfig


class ReferencesConfig(AppConfig):
    name = "apps.references"
    label = "references"
    verbose_name = "References: the portal's reference runs and challenges"

    def ready(self) -> None:
        from apps.references import receivers  # imports models: only once the app registry is ready

        receivers.connect()
