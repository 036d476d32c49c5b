"""Counters moved by other apps' signals: a cell's tier change (its history entry), a Celery task's end."""

from __future__ import annotations

import time
from typing import Any

from celery import signals as celery_signals
from django.db.models.signals import post_save
from django.dispatch import receiver

from apps.core import events
from apps.jobs.models import Job
from apps.matrix.models import CellHistory
from apps.ops.counters import events_stored, task_finished, tier_changed

_STARTED: dict[str, float] = {}  # task id -> when it started, in this worker process


@receiver(post_save, sender=CellHistory, dispatch_uid="ops.tier_changed")
def count_tier_change(sender: type, instance: CellHistory, created: bool, **kwargs: Any) -> None:
    if created and instance.kind == CellHistory.Kind.TIER and instance.tier_before != instance.tier_after:
        tier_changed(instance.cell.hardware.slug, instance.tier_before, instance.tier_after)


@receiver(events.job_events_stored, dispatch_uid="ops.events_stored")
def count_events_stored(sender: Any, job_id: int, timestamps: list, **kwargs: Any) -> None:
    hardware = Job.objects.filter(pk=job_id).values_list("hardware__slug", flat=True).first()
    if hardware is not None:
        events_stored(hardware, timestamps)


@celery_signals.task_prerun.connect(dispatch_uid="ops.task_started")
def task_started(task_id: str | None = None, **kwargs: Any) -> None:
    if task_id:
        _STARTED[task_id] = time.perf_counter()


@celery_signals.task_postrun.connect(dispatch_uid="ops.task_finished")
def task_done(task_id: str | None = None, task: Any = None, state: str | None = None, **kwargs: Any) -> None:
    started = _STARTED.pop(task_id, None) if task_id else None
    name = getattr(task, "name", None) or "unknown"
    task_finished(name, (state or "unknown").lower(), time.perf_counter() - started if started else None)
