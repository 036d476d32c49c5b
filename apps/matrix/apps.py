from __future__ import annotations

from django.apps import AppConfig


class MatrixConfig(AppConfig):
    name = "apps.matrix"
    label = "matrix"
    verbose_name = "Compatibility matrix"

    def ready(self) -> None:
        from apps.matrix import receivers  # imports models: only once the app registry is ready

        receivers.connect()
