from __future__ import annotations

from rest_framework import serializers

from apps.accounts.choices import Role, Scope
from apps.accounts.models import ApiToken, Invitation, Membership, Organization


class ApiTokenSerializer(serializers.ModelSerializer):
    organization = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    hardware = serializers.SlugRelatedField(slug_field="slug", read_only=True, allow_null=True,
                                            help_text="the hardware an agent token is bound to; null otherwise")
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


class MembershipSerializer(serializers.ModelSerializer):
    username = serializers.CharField(source="user.username", read_only=True)

    class Meta:
        model = Membership
        fields = ["username", "role", "created_at"]


class MembershipWriteSerializer(serializers.Serializer):
    username = serializers.CharField(max_length=150)
    role = serializers.ChoiceField(choices=Role.values, required=False, allow_null=True,
                                   help_text="null removes the member")


class InvitationSerializer(serializers.ModelSerializer):
    organization = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    username = serializers.CharField(source="user.username", read_only=True)
    invited_by = serializers.CharField(source="invited_by.username", read_only=True, allow_null=True, default=None)

    class Meta:
        model = Invitation
        fields = ["id", "organization", "username", "role", "invited_by", "state", "created_at", "responded_at"]
        read_only_fields = fields


class InvitationWriteSerializer(serializers.Serializer):
    username = serializers.CharField(max_length=150)
    role = serializers.ChoiceField(choices=Role.values, default=Role.VIEWER)
