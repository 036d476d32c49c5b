from __future__ import annotations

from rest_framework import serializers

from apps.alerts.choices import AlertKind, PayloadFormat
from apps.alerts.models import MAX_URL_LENGTH, Delivery, Subscription
from apps.fleet.choices import RevalidationPolicy
from apps.fleet.models import StackChange


class SubscriptionSerializer(serializers.ModelSerializer):
    """A subscription as read back: never its secret."""

    organization = serializers.SlugRelatedField(slug_field="slug", read_only=True)

    class Meta:
        model = Subscription
        fields = ["id", "organization", "name", "url", "kinds", "format", "active", "created_at", "updated_at"]
        read_only_fields = fields


class SubscriptionWriteSerializer(serializers.Serializer):
    """What a create or update accepts (the schema; ``services`` checks every bound and names the field)."""

    organization = serializers.CharField(required=False, help_text="slug; needed when you administer several")
    name = serializers.CharField(max_length=100)
    url = serializers.CharField(max_length=MAX_URL_LENGTH, help_text="http(s) URL the signed JSON POSTs go to")
    kinds = serializers.ListField(child=serializers.ChoiceField(choices=AlertKind.values), allow_empty=False)
    format = serializers.ChoiceField(choices=PayloadFormat.values, default=PayloadFormat.JSON)
    active = serializers.BooleanField(default=True)
    secret = serializers.CharField(required=False, write_only=True, min_length=16, max_length=128,
                                   help_text="HMAC key; generated when omitted; answered only by the create")


class SubscriptionCreatedSerializer(SubscriptionSerializer):
    secret = serializers.CharField(read_only=True, help_text="shown once: store it to verify X-Day0-Signature")

    class Meta(SubscriptionSerializer.Meta):
        fields = [*SubscriptionSerializer.Meta.fields, "secret"]
        read_only_fields = fields


class DeliverySerializer(serializers.ModelSerializer):
    """One entry of the delivery log."""

    organization = serializers.CharField(source="subscription.organization.slug", read_only=True)
    model = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    hardware = serializers.SlugRelatedField(slug_field="slug", read_only=True)

    class Meta:
        model = Delivery
        fields = ["id", "uuid", "subscription", "organization", "kind", "model", "hardware", "status", "attempts",
                  "response_code", "last_error", "created_at", "last_attempt_at", "next_attempt_at",
                  "delivered_at", "event"]
        read_only_fields = fields


class StackPolicyWriteSerializer(serializers.Serializer):
    policy = serializers.ChoiceField(choices=RevalidationPolicy.values)
    min_tier = serializers.IntegerField(min_value=1, max_value=6, default=1,
                                        help_text="with policy 'tier': re-validate cells at or above it")


class StackChangeSerializer(serializers.ModelSerializer):
    class Meta:
        model = StackChange
        fields = ["id", "hostname", "before", "after", "changed", "policy", "jobs", "created_at"]
        read_only_fields = fields
