"""Alert event kinds, payload formats and delivery states."""

from __future__ import annotations

from django.db import models


class AlertKind(models.TextChoices):
    REGRESSION = "regression", "benchmark regression"
    TIER_DROP = "tier_drop", "cell tier drop"
    JOB_FAILED = "job_failed", "job failed"
    STACK_CHANGE = "stack_change", "software stack change"


class PayloadFormat(models.TextChoices):
    JSON = "json", "JSON event document"
    SLACK = "slack", 'Slack-compatible ({"text": ...})'


class DeliveryStatus(models.TextChoices):
    PENDING = "pending", "pending"
    RETRYING = "retrying", "retrying"
    DELIVERED = "delivered", "delivered"
    FAILED = "failed", "failed"


FINAL_DELIVERY_STATES = (DeliveryStatus.DELIVERED, DeliveryStatus.FAILED)
