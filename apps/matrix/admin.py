from __future__ import annotations

from django.contrib import admin

from apps.matrix.models import Cell


@admin.register(Cell)
class CellAdmin(admin.ModelAdmin):
    """Cells are computed (apps.matrix.services); the admin shows them read-only."""

    list_display = ["model", "hardware", "tier", "failed_stage", "fits", "fits_devices", "updated_at"]
    list_filter = ["tier", "hardware"]
    search_fields = ["model__slug", "hardware__slug"]

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_add_permission(self, request) -> bool:
        return False
