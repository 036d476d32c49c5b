from __future__ import annotations

from django.contrib import admin

from apps.accounts.models import ApiToken, Membership, Organization


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


@admin.register(Organization)
class OrganizationAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "created_at"]
    search_fields = ["slug", "name"]
    inlines = [MembershipInline]


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["user", "organization", "role"]
    list_filter = ["role", "organization"]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Tokens are created through the API or ``manage.py`` (the secret is shown once); here they are listed
    and revoked."""

    list_display = ["prefix", "name", "organization", "user", "scopes", "hardware", "last_used_at", "revoked_at"]
    list_filter = ["organization", "revoked_at"]
    readonly_fields = ["prefix", "key_hash", "created_at", "last_used_at"]
    search_fields = ["prefix", "name"]
