"""The portal's Celery app. Broker from settings (Redis, or kombu's filesystem transport on the embedded default).
The portal's own tasks run on its default queue (``DAY0_CELERY_DEFAULT_QUEUE``); a job goes to an agent as the
task and on the queue ``contract.queues`` names, sent by ``apps.jobs.dispatch.send_job``."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "day0portal.settings")

app = Celery("day0portal")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
