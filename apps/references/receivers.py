"""Reactions to catalog changes: a release saved with a ``reference_source`` gets a reference run for the
current pool version once the change commits (``services.ensure_references`` is idempotent)."""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction
from django.db.models.signals import post_save
from django.dispatch import receiver

from apps.catalog.models import ModelRelease

logger = logging.getLogger(__name__)


@receiver(post_save, sender=ModelRelease, dispatch_uid="references.release_saved")
def release_saved(sender: type, instance: ModelRelease, **kwargs: Any) -> None:
    if not instance.reference_source or kwargs.get("raw"):
        return
    release_id = instance.pk

    def queue() -> None:
        from apps.references.services import ensure_references

        release = ModelRelease.objects.filter(pk=release_id).first()
        if release is not None:
            try:
                ensure_references([release])
            except Exception:  # never lose the release over its reference: staff can queue it again
                logger.exception("queueing the reference run of release %s failed", release_id)

    transaction.on_commit(queue)
