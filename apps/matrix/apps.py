from __future__ import annotations

from django.apps import AppConfig


class MatrixConfig(AppConfig):
    name = "apps.matrix"
    label = "matrix"
    verbose_name = "Compatibility matrix"

    def ready(self) -> None:
        from django.db.models.signals import post_delete, post_save

        from apps.matrix import receivers  # imports models: only once the app registry is ready
        from apps.matrix.grid_cache import on_catalog_change

        receivers.connect()
        # the rendered matrix shows models, hardware and each cell's engine (its name, version and whether it is the
        # default, which ranks it): any save or delete of one makes it stale
        for name, signal in (("save", post_save), ("delete", post_delete)):
            for sender in ("catalog.ModelRelease", "catalog.Hardware", "catalog.Engine", "matrix.Cell"):
                signal.connect(on_catalog_change, sender=sender, dispatch_uid=f"matrix-grid:{sender}:{name}")
