from __future__ import annotations

from django.contrib import admin

from apps.matrix.models import Cell, CellHistory


@admin.register(Cell)
class CellAdmin(admin.ModelAdmin):
    """Cells are computed (apps.matrix.services); the admin shows them read-only."""

    list_display = ["model", "hardware", "engine", "tier", "failed_stage", "fits", "fits_devices", "updated_at"]
    list_filter = ["tier", "hardware", "engine"]
    search_fields = ["model__slug", "hardware__slug"]

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_add_permission(self, request) -> bool:
        return False


@admin.register(CellHistory)
class CellHistoryAdmin(admin.ModelAdmin):
    """A cell's tier changes and re-judgings with their reasons (written by apps.matrix.services); read-only."""

    list_display = ["cell", "kind", "tier_before", "tier_after", "reason", "at"]
    list_filter = ["kind"]
    search_fields = ["cell__model__slug", "cell__hardware__slug", "reason"]

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_add_permission(self, request) -> bool:
        return False
