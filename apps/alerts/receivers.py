"""The domain events alerts subscribe to (``apps.core.events``, published after commit by the app that owns the
fact), each turned into the deliveries of its kind: connected in ``AlertsConfig.ready``."""

from __future__ import annotations

from typing import Any

from apps.alerts import services
from apps.core import events


def on_job_failed(**facts: Any) -> None:
    services.do_alert_job_failed(**facts)


def on_tier_dropped(**facts: Any) -> None:
    services.do_alert_tier_drop(**facts)


def on_benchmark_recorded(*, run_id: int, **_: Any) -> None:
    services.queue_benchmark_run_check(run_id)


def on_stack_changed(*, stack_change_id: int, **_: Any) -> None:
    services.do_alert_stack_change(stack_change_id)


def connect() -> None:
    events.job_failed.connect(on_job_failed, dispatch_uid="alerts.job_failed")
    events.tier_dropped.connect(on_tier_dropped, dispatch_uid="alerts.tier_dropped")
    events.benchmark_recorded.connect(on_benchmark_recorded, dispatch_uid="alerts.benchmark_recorded")
    events.stack_changed.connect(on_stack_changed, dispatch_uid="alerts.stack_changed")
