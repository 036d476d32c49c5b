"""Celery tasks of alerts (queue ``portal``): one delivery attempt per run, retried with backoff."""

from __future__ import annotations

from celery import shared_task

from apps.alerts import services
from apps.alerts.choices import DeliveryStatus


@shared_task(name="alerts.deliver", bind=True, ignore_result=True, max_retries=services.MAX_ATTEMPTS - 1)
def deliver_alert_task(self, delivery_id: int) -> None:  # noqa: ANN001 (Celery's bound task)
    """POSTs one delivery (``services.do_attempt_delivery``); a retryable failure comes back after
    ``services.backoff_seconds`` (10 s, 20 s, 40 s … by default)."""
    delivery = services.do_attempt_delivery(delivery_id)
    if delivery is not None and delivery.status == DeliveryStatus.RETRYING:
        raise self.retry(countdown=services.backoff_seconds(delivery.attempts))


@shared_task(name="alerts.benchmark_run", ignore_result=True, autoretry_for=(Exception,), retry_backoff=True,
             max_retries=3)
def alert_benchmark_run_task(run_id: int) -> None:
    """Looks for regressions in a new benchmark run off the request path (``services.do_alert_benchmark_run``)."""
    services.do_alert_benchmark_run(run_id)
