"""Alerts: organizations' webhook subscriptions and the log of every delivery."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models

from apps.alerts.choices import AlertKind, DeliveryStatus, PayloadFormat

MAX_URL_LENGTH = 2000


class Subscription(models.Model):
    """An organization's webhook: the event kinds it wants, where to POST them and the shared secret that signs
    each body (HMAC-SHA256). The secret is shown once, when the subscription is created, and never again."""

    organization = models.ForeignKey("accounts.Organization", on_delete=models.CASCADE,
                                     related_name="alert_subscriptions")
    name = models.CharField(max_length=100)
    url = models.URLField(max_length=MAX_URL_LENGTH)
    secret = models.CharField(max_length=128)
    kinds = models.JSONField(default=list, help_text=f"event kinds: {', '.join(AlertKind.values)}")
    format = models.CharField(max_length=8, choices=PayloadFormat.choices, default=PayloadFormat.JSON)
    active = models.BooleanField(default=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["organization_id", "name", "id"]

    def __str__(self) -> str:
        return f"{self.name} ({self.organization_id})"


class Delivery(models.Model):
    """One event sent (or being sent) to one subscription: the event document, and the outcome of the newest
    attempt. ``uuid`` travels in the ``X-Day0-Delivery`` header so receivers can drop duplicates."""

    uuid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    subscription = models.ForeignKey(Subscription, on_delete=models.CASCADE, related_name="deliveries")
    kind = models.CharField(max_length=16, choices=AlertKind.choices)
    model = models.ForeignKey("catalog.ModelRelease", null=True, blank=True, on_delete=models.SET_NULL,
                              related_name="+")
    hardware = models.ForeignKey("catalog.Hardware", null=True, blank=True, on_delete=models.SET_NULL,
                                 related_name="+")
    event = models.JSONField(help_text="the event document (the JSON body; Slack bodies are built from it)")
    status = models.CharField(max_length=16, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING,
                              db_index=True)
    attempts = models.PositiveIntegerField(default=0)
    response_code = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "deliveries"

    def __str__(self) -> str:
        return f"{self.kind} -> {self.subscription_id} ({self.status})"
