from __future__ import annotations

from django.apps import AppConfig


class DashboardsConfig(AppConfig):
    name = "apps.dashboards"
    label = "dashboards"
    verbose_name = "Dashboards"
