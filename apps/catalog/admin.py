from __future__ import annotations

from django.contrib import admin

from apps.catalog.models import Engine, Hardware, ModelRelease


@admin.register(ModelRelease)
class ModelReleaseAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "organization", "architecture", "params_total", "params_active", "released_at",
                    "visibility"]
    list_filter = ["family", "visibility", "organization"]
    search_fields = ["slug", "name", "hf_repo"]
    readonly_fields = ["architecture", "family", "params_total", "params_active", "context_length", "dtype"]


@admin.register(Hardware)
class HardwareAdmin(admin.ModelAdmin):
    """Staff's view of the catalog: the owner decides who mints agent tokens (empty = a shared entry)."""

    list_display = ["slug", "vendor", "name", "organization", "memory_bytes", "devices_per_node"]
    list_filter = ["vendor", "organization"]
    list_select_related = ["organization"]
    autocomplete_fields = ["organization"]
    search_fields = ["slug", "name", "vendor"]


@admin.register(Engine)
class EngineAdmin(admin.ModelAdmin):
    """The serving engines a job may name (the bundled runtime, vLLM, any OpenAI-compatible server)."""

    list_display = ["name", "version", "executable", "default", "created_at"]
    list_filter = ["name", "default"]
    search_fields = ["name", "version", "obtained_by"]
