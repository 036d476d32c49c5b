from __future__ import annotations

from rest_framework import serializers

from apps.accounts.choices import Scope
from apps.accounts.models import ApiToken, Organization


class ApiTokenSerializer(serializers.ModelSerializer):
    organization = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    hardware = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    user = serializers.CharField(source="user.username", read_only=True)

    class Meta:
        model = ApiToken
        fields = ["id", "name", "prefix", "organization", "user", "scopes", "hardware", "created_at", "last_used_at",
                  "revoked_at"]
        read_only_fields = fields


class ApiTokenCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    organization = serializers.SlugRelatedField(slug_field="slug", queryset=Organization.objects.all(),
                                                required=False)
    scopes = serializers.ListField(child=serializers.ChoiceField(choices=Scope.values), allow_empty=False)
    hardware = serializers.CharField(required=False, allow_null=True)


class OrganizationSerializer(serializers.ModelSerializer):
    class Meta:
        model = Organization
        fields = ["id", "slug", "name", "created_at"]
