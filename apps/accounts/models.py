"""Organizations, their members' roles, and hashed API tokens."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from apps.accounts.choices import InvitationState, Role, Scope


class Organization(models.Model):
    """A vendor, lab or team. Private (embargoed) models and their evidence are seen only by its members."""

    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class Membership(models.Model):
    """A user's role in an organization: viewers read, submitters create jobs, admins manage members and tokens."""

    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.VIEWER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["organization", "user"], name="uniq_membership")]

    def __str__(self) -> str:
        return f"{self.user} in {self.organization} ({self.role})"


class Invitation(models.Model):
    """An admin's invitation of a user into an organization with a role. Membership needs the invitee's consent:
    the membership exists only once the invitee accepts; a declined or revoked invitation changes nothing."""

    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="invitations")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="invitations")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.VIEWER)
    invited_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="invitations_sent")
    state = models.CharField(max_length=16, choices=InvitationState.choices, default=InvitationState.PENDING)
    created_at = models.DateTimeField(auto_now_add=True)
    responded_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["organization", "user"], condition=models.Q(state="pending"),
                                               name="uniq_pending_invitation")]

    def __str__(self) -> str:
        return f"{self.user} to {self.organization} as {self.role} ({self.state})"


class ApiToken(models.Model):
    """An API token. Only the sha256 of the secret is stored; the prefix identifies it in lists.

    Scopes: read, submit, agent. An agent token is bound to one hardware and may report only on its jobs."""

    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="tokens")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, db_index=True)
    key_hash = models.CharField(max_length=64, unique=True)
    scopes = models.JSONField(default=list)
    hardware = models.ForeignKey(
        "catalog.Hardware", null=True, blank=True, on_delete=models.CASCADE, related_name="agent_tokens"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.name})"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None

    def has_scope(self, scope: str) -> bool:
        return scope in self.scopes


__all__ = ["ApiToken", "Invitation", "Membership", "Organization", "Role", "Scope"]
