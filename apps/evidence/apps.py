from __future__ import annotations

from django.apps import AppConfig


class EvidenceConfig(AppConfig):
    name = "apps.evidence"
    label = "evidence"
    verbose_name = "Evidence: stage results"

    def ready(self) -> None:
        from apps.evidence import (
            checks,  # noqa: F401  (registers the outdated-verdicts check)
            receivers,  # imports models: only once the app registry is ready
        )

        receivers.connect()
