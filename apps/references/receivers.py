"""Reactions of references: a release saved with a ``reference_source`` gets a reference run for the current pool
version once the change commits (``services.ensure_references`` is idempotent); a job dispatched as a new attempt
gets that attempt's secret challenge (the ``job_dispatched`` event of ``apps.core.events``)."""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction
from django.db.models.signals import post_save

from apps.catalog.models import ModelRelease
from apps.core import events
from apps.jobs import dispatch
from apps.references.selectors import payload_for
from apps.references.services import draw_challenge, ensure_references

logger = logging.getLogger(__name__)


def release_saved(sender: type, instance: ModelRelease, **kwargs: Any) -> None:
    if not instance.reference_source or kwargs.get("raw"):
        return
    release_id = instance.pk

    def queue() -> None:
        release = ModelRelease.objects.filter(pk=release_id).first()
        if release is not None:
            try:
                ensure_references([release])
            except Exception:  # never lose the release over its reference: staff can queue it again
                logger.exception("queueing the reference run of release %s failed", release_id)

    transaction.on_commit(queue)


def on_job_dispatched(*, job: Any, **_: Any) -> None:
    draw_challenge(job)  # this attempt's secret challenge (a certify job running align or eval)


def connect() -> None:
    post_save.connect(release_saved, sender=ModelRelease, dispatch_uid="references.release_saved")
    events.job_dispatched.connect(on_job_dispatched, dispatch_uid="references.job_dispatched")
    dispatch.add_payload_part(payload_for)  # an attempt's challenge, or a reference run's pool
