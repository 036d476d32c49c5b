"""Celery tasks of alerts (queue ``portal``): one delivery attempt per run, retried with backoff
(the regression check of a benchmark run is ``regressions.alert_benchmark_run_task``)."""

from __future__ import annotations

from celery import shared_task

from apps.alerts import delivery as attempt
from apps.alerts.choices import DeliveryStatus


@shared_task(name="alerts.deliver", bind=True, ignore_result=True, max_retries=attempt.MAX_ATTEMPTS - 1)
def deliver_alert_task(self, delivery_id: int) -> None:  # noqa: ANN001 (Celery's bound task)
    """POSTs one delivery (``delivery.do_attempt_delivery``); a retryable failure comes back after
    ``delivery.backoff_seconds`` (10 s, 20 s, 40 s … by default)."""
    done = attempt.do_attempt_delivery(delivery_id)
    if done is not None and done.status == DeliveryStatus.RETRYING:
        raise self.retry(countdown=attempt.backoff_seconds(done.attempts))
