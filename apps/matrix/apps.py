from __future__ import annotations

from django.apps import AppConfig


class MatrixConfig(AppConfig):
    name = "apps.matrix"
    label = "matrix"
    verbose_name = "Compatibility matrix"
