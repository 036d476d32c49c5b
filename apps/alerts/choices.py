"""Alert event kinds, payload formats, delivery states and stack-change re-validation policies."""

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


class RevalidationPolicy(models.TextChoices):
    OFF = "off", "record stack changes only"
    AT_OR_ABOVE_TIER = "tier", "re-validate cells at or above a tier"
    ALL = "all", "re-validate every cell with evidence"
