from __future__ import annotations

from django.contrib import admin

from apps.jobs.models import Job, JobEvent, JobNode


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
    list_display = ["job", "node", "seq", "ts", "stage", "kind", "level", "message"]
    list_filter = ["level", "kind", "node"]
    raw_id_fields = ["job"]


@admin.register(JobNode)
class JobNodeAdmin(admin.ModelAdmin):
    """A multi-node job's reserved hosts; reservations change only through ``placement`` and the node API."""

    list_display = ["job", "attempt", "rank", "agent", "state", "master_addr", "master_port", "reserved_at"]
    list_filter = ["state"]
    readonly_fields = ["state", "events", "events_acked", "claimed_at", "finished_at"]
    raw_id_fields = ["job", "agent"]
