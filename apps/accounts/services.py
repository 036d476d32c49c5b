"""Organizations, members and API tokens."""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Any

from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.utils import timezone

from apps.accounts.access import Actor
from apps.accounts.authentication import hash_secret
from apps.accounts.choices import SCOPES_FOR_ROLE, InvitationState, Role, Scope
from apps.accounts.events import broadcast_token_revoked
from apps.accounts.models import ApiToken, Invitation, Membership, Organization
from apps.core.errors import ConflictError

if TYPE_CHECKING:
    from apps.catalog.models import Hardware

TOKEN_PREFIX_LEN = 8


def hardware_rows() -> Any:
    """The hardware an agent token may be bound to, with their organizations (the rows ``ApiToken.hardware`` points
    at: catalog's model, named there by its label because accounts sits below catalog)."""
    return ApiToken._meta.get_field("hardware").related_model.objects.select_related("organization")


def do_create_organization(*, slug: str, name: str) -> Organization:
    org = Organization(slug=slug, name=name)
    org.full_clean()
    org.save()
    return org


def do_set_membership(org: Organization, user, role: str) -> Membership:
    """Adds ``user`` to ``org`` with ``role``, or changes their role."""
    if role not in Role.values:
        raise ValidationError({"role": f"must be one of {', '.join(Role.values)}"})
    membership, _ = Membership.objects.update_or_create(organization=org, user=user, defaults={"role": role})
    return membership


@transaction.atomic
def do_create_api_token(*, organization: Organization, user, name: str, scopes: list[str],
                        hardware_id: int | None = None) -> tuple[ApiToken, str]:
    """Creates a token and returns it with its secret; only the secret's sha256 is stored."""
    unknown = sorted(set(scopes) - set(Scope.values))
    if not scopes or unknown:
        raise ValidationError({"scopes": f"must be a non-empty subset of {', '.join(Scope.values)}"})
    if Scope.AGENT in scopes and hardware_id is None:
        raise ValidationError({"hardware": "an agent token must be bound to a hardware"})
    if Scope.AGENT not in scopes and hardware_id is not None:
        raise ValidationError({"hardware": "only agent tokens are bound to a hardware"})
    secret = f"d0_{secrets.token_urlsafe(32)}"
    token = ApiToken.objects.create(organization=organization, user=user, name=name,
                                    prefix=secret[:TOKEN_PREFIX_LEN], key_hash=hash_secret(secret),
                                    scopes=sorted(set(scopes) | {Scope.READ}), hardware_id=hardware_id)
    return token, secret


def check_agent_token_hardware(actor: Actor, *, organization: Organization, hardware: Hardware) -> None:
    """Who may bind an agent token to ``hardware`` (an agent token reads the jobs its hardware's queue carries):
    an admin of the hardware's owning organization, or staff, and the token belongs to that organization; for a
    shared catalog entry (no owner), staff only. Raises ``PermissionDenied`` naming the hardware and the rule."""
    owner = hardware.organization
    if owner is None:
        if not (actor.is_staff and actor.token is None):
            raise PermissionDenied(f"hardware {hardware.slug} is a shared catalog entry: only staff create its "
                                   "agent tokens")
        return
    if not actor.administers_hardware(owner.pk):
        raise PermissionDenied(f"hardware {hardware.slug} belongs to {owner.slug}: only admins of {owner.slug} "
                               "or staff create its agent tokens")
    if organization.pk != owner.pk:
        raise PermissionDenied(f"hardware {hardware.slug} belongs to {owner.slug}: its agent tokens belong to "
                               f"{owner.slug}, not {organization.slug}")


def check_create_api_token(actor: Actor, *, organization: Organization, name: str, scopes: list[str],
                           hardware: Hardware | None = None) -> tuple[ApiToken, str]:
    """Members create tokens within their role; agent tokens need an admin and ``check_agent_token_hardware``.
    Tokens cannot mint tokens. The one way tokens are created (API, ``manage.py create_token``, the demo)."""
    if actor.token is not None:
        raise PermissionDenied("tokens are created from a signed-in session, not with another token")
    role = actor.role_in(organization.pk)
    allowed = SCOPES_FOR_ROLE[Role.ADMIN] if actor.is_staff else SCOPES_FOR_ROLE.get(role or "", set())
    if not allowed:
        raise PermissionDenied(f"you are not a member of {organization.slug}")
    beyond = sorted(set(scopes) - allowed)
    if beyond:
        raise PermissionDenied(f"your role ({role or 'staff'}) cannot grant the scopes {beyond}")
    if hardware is not None and Scope.AGENT in scopes:
        check_agent_token_hardware(actor, organization=organization, hardware=hardware)
    user = get_user_model().objects.get(pk=actor.user_id)
    return do_create_api_token(organization=organization, user=user, name=name, scopes=scopes,
                               hardware_id=hardware.pk if hardware is not None else None)


def do_revoke_api_token(token: ApiToken) -> ApiToken:
    """Revokes a token: the API refuses it at once, and its open WebSockets are closed (4401) after commit."""
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
        token_id = token.pk
        transaction.on_commit(lambda: broadcast_token_revoked(token_id))
    return token


def check_revoke_api_token(actor: Actor, token: ApiToken) -> ApiToken:
    """A token's owner or an admin of its organization revokes it, from a session or with a submit token: a
    read-only or agent token cannot revoke tokens (not even its own admin's)."""
    if actor.token is not None and not actor.token.has_scope(Scope.SUBMIT):
        raise PermissionDenied("revoking a token needs a signed-in session or a token with the submit scope; "
                               f"this token's scopes are {', '.join(sorted(actor.token.scopes))}")
    if not (actor.user_id == token.user_id or actor.is_admin_of(token.organization_id)):
        raise PermissionDenied("only the token's owner or an organization admin can revoke it")
    return do_revoke_api_token(token)


def _require_admin(actor: Actor, org: Organization) -> None:
    if actor.token is not None and Scope.SUBMIT not in actor.token.scopes:
        raise PermissionDenied("managing members needs a session or a submit token of an admin")
    if not actor.is_admin_of(org.pk):
        raise PermissionDenied(f"only admins of {org.slug} manage its members")


def check_set_membership(actor: Actor, org: Organization, *, username: str, role: str | None) -> Membership | None:
    """Organization admins change a member's role or remove them (``role=None``). The last admin cannot be demoted
    or removed. A user who is not a member joins only by accepting an invitation (``check_invite_member``): an
    admin adding them here is a 400 that points there."""
    _require_admin(actor, org)
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        raise ValidationError({"username": f"no user {username!r}"})
    current = Membership.objects.filter(organization=org, user=user).first()
    if current is None:
        if role is None:
            return None
        raise ValidationError({"username": (
            f"{username} is not a member of {org.slug}: members join by accepting an invitation; send one with "
            f"POST /api/v1/organizations/{org.slug}/invitations/ {{\"username\": \"{username}\", \"role\": "
            f"\"{role}\"}}")})
    if current.role == Role.ADMIN and role != Role.ADMIN:
        if Membership.objects.filter(organization=org, role=Role.ADMIN).count() == 1:
            raise ValidationError({"role": f"{username} is the last admin of {org.slug}"})
    if role is None:
        current.delete()
        return None
    return do_set_membership(org, user, role)


def check_invite_member(actor: Actor, org: Organization, *, username: str, role: str) -> Invitation:
    """An admin invites a user (not yet a member) with a role; the user becomes a member only by accepting.
    Inviting again while an invitation is pending updates its role."""
    _require_admin(actor, org)
    if role not in Role.values:
        raise ValidationError({"role": f"must be one of {', '.join(Role.values)}"})
    user = get_user_model().objects.filter(username=username, is_active=True).first()
    if user is None:
        raise ValidationError({"username": f"no active user {username!r}"})
    if Membership.objects.filter(organization=org, user=user).exists():
        raise ValidationError({"username": f"{username} is already a member of {org.slug}: change the role with "
                                           f"POST /api/v1/organizations/{org.slug}/members/"})
    with transaction.atomic():
        invitation, _ = Invitation.objects.select_for_update().update_or_create(
            organization=org, user=user, state=InvitationState.PENDING,
            defaults={"role": role, "invited_by_id": actor.user_id})
    return invitation


def _check_invitee(actor: Actor, invitation: Invitation) -> None:
    if actor.user_id != invitation.user_id:
        raise PermissionDenied("only the invited user answers an invitation")
    if actor.token is not None and not actor.token.has_scope(Scope.SUBMIT):
        raise PermissionDenied("answering an invitation needs a signed-in session or a submit token")
    if invitation.state != InvitationState.PENDING:
        raise ConflictError(f"invitation {invitation.pk} is {invitation.state}, not pending")


@transaction.atomic
def check_accept_invitation(actor: Actor, invitation: Invitation) -> Membership:
    """The invitee accepts: they become a member with the invited role (a pending invitation only)."""
    invitation = Invitation.objects.select_for_update().get(pk=invitation.pk)
    _check_invitee(actor, invitation)
    invitation.state, invitation.responded_at = InvitationState.ACCEPTED, timezone.now()
    invitation.save(update_fields=["state", "responded_at"])
    membership, _ = Membership.objects.get_or_create(organization_id=invitation.organization_id,
                                                     user_id=invitation.user_id,
                                                     defaults={"role": invitation.role})
    return membership


@transaction.atomic
def check_decline_invitation(actor: Actor, invitation: Invitation) -> Invitation:
    """The invitee declines (nothing else changes), or an admin of the organization revokes a pending one."""
    invitation = Invitation.objects.select_for_update().get(pk=invitation.pk)
    if actor.user_id == invitation.user_id:
        _check_invitee(actor, invitation)
        state = InvitationState.DECLINED
    else:
        _require_admin(actor, invitation.organization)
        if invitation.state != InvitationState.PENDING:
            raise ConflictError(f"invitation {invitation.pk} is {invitation.state}, not pending")
        state = InvitationState.REVOKED
    invitation.state, invitation.responded_at = state, timezone.now()
    invitation.save(update_fields=["state", "responded_at"])
    return invitation
