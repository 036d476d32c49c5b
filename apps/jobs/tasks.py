"""Periodic portal tasks of the jobs app (run by a portal Celery worker with beat, queue ``portal``)."""

from __future__ import annotations

import logging

from celery import shared_task

from apps.jobs import recovery
from day0portal.env import env_int

logger = logging.getLogger(__name__)

DETECT_LOST_EVERY_SECONDS = env_int("DAY0_DETECT_LOST_EVERY", 10, minimum=1)


@shared_task(name="jobs.detect_lost_jobs", ignore_result=True, autoretry_for=(Exception,), retry_backoff=True,
             max_retries=3)
def detect_lost_jobs_task() -> list[int]:
    """Jobs whose agent stopped heartbeating become lost and are re-queued (``recovery.do_requeue_lost_jobs``)."""
    return recovery.do_requeue_lost_jobs()


def _schedule() -> None:
    from day0portal.celery import app  # the Celery app autodiscovers the apps' tasks: loaded when needed

    app.conf.beat_schedule = {
        **(app.conf.beat_schedule or {}),
        "jobs.detect_lost_jobs": {"task": "jobs.detect_lost_jobs", "schedule": float(DETECT_LOST_EVERY_SECONDS),
                                  "options": {"queue": app.conf.task_default_queue or "portal",
                                              "expires": float(DETECT_LOST_EVERY_SECONDS)}},
    }


_schedule()
