from __future__ import annotations

from django.contrib import admin

from apps.jobs.models import Job, JobEvent


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    """Read-mostly: state changes go through services.do_transition_job (the API's cancel, the agents)."""

    list_display = ["id", "model", "hardware", "state", "attempts", "failed_stage", "created_at"]
    list_filter = ["state", "hardware"]
    search_fields = ["model__slug", "hardware__slug"]
    readonly_fields = ["state", "attempts", "events_acked", "dispatched_at", "started_at", "finished_at"]
    raw_id_fields = ["model", "hardware", "agent", "requested_by", "organization"]


@admin.register(JobEvent)
class JobEventAdmin(admin.ModelAdmin):
    list_display = ["job", "seq", "ts", "stage", "kind", "level", "message"]
    list_filter = ["level", "kind"]
    raw_id_fields = ["job"]
