from __future__ import annotations

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from apps.accounts.models import ApiToken, Invitation, Membership, Organization
from apps.accounts.services import do_revoke_api_token


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


@admin.register(Invitation)
class InvitationAdmin(admin.ModelAdmin):
    list_display = ["user", "organization", "role", "state", "invited_by", "created_at"]
    list_filter = ["state", "role", "organization"]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Tokens are created through the API or ``manage.py create_token`` (the secret is shown once); here they
    are listed and revoked."""

    list_display = ["prefix", "name", "organization", "user", "scopes", "hardware", "last_used_at", "revoked_at"]
    actions = ["revoke"]
    list_filter = ["organization", "revoked_at"]
    readonly_fields = ["prefix", "key_hash", "created_at", "last_used_at"]
    search_fields = ["prefix", "name"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # a secret is only shown at creation: use the API or `manage.py create_token`

    @admin.action(description="Revoke selected tokens")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        for token in queryset:
            do_revoke_api_token(token)
