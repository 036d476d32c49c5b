from __future__ import annotations

from django.contrib import admin

from apps.references.models import Challenge, ReferenceRun


@admin.register(ReferenceRun)
class ReferenceRunAdmin(admin.ModelAdmin):
    list_display = ("release", "pool_version", "state", "job", "created_at", "finished_at")
    list_filter = ("state",)
    exclude = ("outputs", "needles")


@admin.register(Challenge)
class ChallengeAdmin(admin.ModelAdmin):
    list_display = ("job", "attempt", "pool_version", "created_at")
    exclude = ("keys",)
