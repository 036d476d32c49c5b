from __future__ import annotations

from django.contrib import admin

from apps.fleet.models import Agent, HardwarePolicy, HardwareStack, StackChange


@admin.register(Agent)
class AgentAdmin(admin.ModelAdmin):
    list_display = ["hostname", "hardware", "last_heartbeat_at", "registered_at", "current_job"]
    list_filter = ["hardware"]
    raw_id_fields = ["current_job", "token"]


@admin.register(HardwarePolicy)
class HardwarePolicyAdmin(admin.ModelAdmin):
    list_display = ["hardware", "policy", "min_tier", "updated_at"]


@admin.register(HardwareStack)
class HardwareStackAdmin(admin.ModelAdmin):
    list_display = ["hardware", "reported_by", "updated_at"]


@admin.register(StackChange)
class StackChangeAdmin(admin.ModelAdmin):
    list_display = ["hardware", "changed", "hostname", "policy", "jobs", "created_at"]
    list_filter = ["hardware"]
