"""Celery tasks of evidence (queue ``portal``, the portal's worker, never the web process)."""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task
from django.db import transaction

from apps.evidence import reruns
from apps.evidence.models import StageResult

logger = logging.getLogger(__name__)


@shared_task(name="evidence.rerun_code", ignore_result=True, autoretry_for=(Exception,), retry_backoff=True,
             max_retries=3)
def rerun_code_task(result_id: int) -> dict[str, Any]:
    """Runs a challenged eval's code the reference run did not, in the sandbox (``reruns.do_rerun_code``)."""
    return reruns.do_rerun_code(result_id)


def queue_rerun(result: StageResult) -> None:
    """After ``result`` commits, asks the portal's worker to re-run its code items that are still the agent's
    word; a broker outage loses nothing (they stay the agent's word, marked on the cell page)."""
    if not reruns.pending(result):
        return
    result_id = result.pk

    def send() -> None:
        try:
            rerun_code_task.delay(result_id)
        except Exception:
            logger.exception("the re-run of result %s's code could not be queued", result_id)

    transaction.on_commit(send)
