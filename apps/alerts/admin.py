from __future__ import annotations

from django.contrib import admin

from apps.alerts.models import Delivery, Subscription


@admin.register(Subscription)
class SubscriptionAdmin(admin.ModelAdmin):
    list_display = ["name", "organization", "url", "format", "active", "created_at"]
    list_filter = ["active", "format", "organization"]
    exclude = ["secret"]  # shown once, on creation through the API; never displayed again


@admin.register(Delivery)
class DeliveryAdmin(admin.ModelAdmin):
    list_display = ["id", "kind", "subscription", "status", "attempts", "response_code", "last_error",
                    "created_at", "last_attempt_at", "delivered_at"]
    list_filter = ["status", "kind"]
    readonly_fields = ["uuid", "subscription", "kind", "model", "hardware", "event", "status", "attempts",
                       "response_code", "last_error", "created_at", "last_attempt_at", "next_attempt_at",
                       "delivered_at"]
