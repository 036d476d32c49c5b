from __future__ import annotations

from rest_framework import serializers

from apps.fleet.models import Agent


class AgentSerializer(serializers.ModelSerializer):
    hardware = serializers.CharField(source="hardware.slug", read_only=True)
    online = serializers.BooleanField(read_only=True)

    class Meta:
        model = Agent
        fields = ["id", "hardware", "hostname", "capabilities", "versions", "registered_at", "last_heartbeat_at",
                  "online", "current_job"]
        read_only_fields = fields


class AgentRegisterSerializer(serializers.Serializer):
    hostname = serializers.CharField(max_length=255)
    hardware = serializers.CharField(max_length=64, required=False)
    capabilities = serializers.DictField(required=False)
    versions = serializers.DictField(required=False)


class HeartbeatSerializer(serializers.Serializer):
    current_job = serializers.IntegerField(required=False, allow_null=True)
    versions = serializers.DictField(required=False, help_text="the agent's environment lock, when it changed")
