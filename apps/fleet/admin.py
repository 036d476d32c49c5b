from __future__ import annotations

from django.contrib import admin

from apps.fleet.models import Agent


@admin.register(Agent)
class AgentAdmin(admin.ModelAdmin):
    list_display = ["hostname", "hardware", "last_heartbeat_at", "registered_at", "current_job"]
    list_filter = ["hardware"]
    raw_id_fields = ["current_job", "token"]
