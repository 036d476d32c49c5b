from __future__ import annotations

import json
from typing import Any

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


# an agent's capabilities and environment lock are a few hundred bytes; every agent list and every dispatch reads
# them, so a report past this is refused rather than stored
MAX_AGENT_FACTS_BYTES = 64 * 1024


def _bounded_facts(value: dict[str, Any]) -> dict[str, Any]:
    size = len(json.dumps(value, separators=(",", ":")).encode())
    if size > MAX_AGENT_FACTS_BYTES:
        raise serializers.ValidationError(f"is {size} bytes of JSON; at most {MAX_AGENT_FACTS_BYTES} are stored")
    return value


class AgentRegisterSerializer(serializers.Serializer):
    hostname = serializers.CharField(max_length=255)
    hardware = serializers.CharField(max_length=64, required=False)
    capabilities = serializers.DictField(required=False, validators=[_bounded_facts])
    versions = serializers.DictField(required=False, validators=[_bounded_facts])


class HeartbeatSerializer(serializers.Serializer):
    current_job = serializers.IntegerField(required=False, allow_null=True)
    versions = serializers.DictField(required=False, help_text="the agent's environment lock, when it changed",
                                     validators=[_bounded_facts])
