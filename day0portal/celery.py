"""The Celery app. Broker from settings (Redis, or kombu's filesystem transport on the embedded default).
Routing of adaptation tasks to the queue ``hw.<hardware-slug>`` is set by the agents' dispatch code."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "day0portal.settings")

app = Celery("day0portal")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
