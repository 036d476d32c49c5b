from __future__ import annotations

from django.db import models


class Role(models.TextChoices):
    VIEWER = "viewer", "viewer"
    SUBMITTER = "submitter", "submitter"
    ADMIN = "admin", "admin"


class Scope(models.TextChoices):
    READ = "read", "read"
    SUBMIT = "submit", "submit"
    AGENT = "agent", "agent"


class InvitationState(models.TextChoices):
    PENDING = "pending", "pending"
    ACCEPTED = "accepted", "accepted"
    DECLINED = "declined", "declined"
    REVOKED = "revoked", "revoked"


# What each role may do; a token's scopes must be within its creator's role.
ROLE_RANK: dict[str, int] = {Role.VIEWER: 0, Role.SUBMITTER: 1, Role.ADMIN: 2}
SCOPES_FOR_ROLE: dict[str, set[str]] = {
    Role.VIEWER: {Scope.READ},
    Role.SUBMITTER: {Scope.READ, Scope.SUBMIT},
    Role.ADMIN: {Scope.READ, Scope.SUBMIT, Scope.AGENT},
}
