"""The portal's Celery app: configuration from the ``CELERY_*`` settings (the broker: DAY0_BROKER_URL, else Redis,
else kombu's filesystem transport on the embedded default; portal tasks on the ``portal`` queue) and the
``tasks.py`` of every installed app (lost-job detection, alert delivery). Nothing routes here: the portal's
dispatch (``apps.jobs.dispatch.send_job``) names each adaptation message's task and queue itself, by
``contract.queues``: ``hw.<hardware-slug>`` or, for a node of a multi-node job, ``agent.<id>``."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "day0portal.settings")

app = Celery("day0portal")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
