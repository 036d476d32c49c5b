"""Who is asking: the ``Actor`` behind a request (session user or API token), its organizations and scopes.

Reading public data needs nothing. Private (embargoed) data is visible to members of its organization;
a token sees only its own organization's private data. Writing needs a scope: ``submit`` (jobs, models),
``agent`` (events, results, agent registration; the token's hardware only).

Hardware belongs to an organization (its admins edit it and mint its agent tokens) or is a shared catalog entry
(staff's). An agent token sees the embargoed jobs its organization may see; the token of a shared entry minted
by staff also sees the jobs its queue carries (``Actor.operates_shared_hardware``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from django.contrib.auth import get_user_model
from django.http import HttpRequest

from apps.accounts.choices import ROLE_RANK, SCOPES_FOR_ROLE, Role, Scope
from apps.accounts.models import ApiToken, Membership


@dataclass
class Actor:
    """The permissions of one request, computed once (one query for memberships)."""

    user_id: int | None = None
    is_staff: bool = False
    token: ApiToken | None = None
    roles: dict[int, str] = field(default_factory=dict)  # organization id -> role

    @property
    def authenticated(self) -> bool:
        return self.user_id is not None

    @property
    def org_ids(self) -> set[int]:
        return set(self.roles)

    @property
    def hardware_id(self) -> int | None:
        """The hardware an agent token is bound to."""
        return self.token.hardware_id if self.token is not None else None

    def role_in(self, org_id: int | None) -> str | None:
        return self.roles.get(org_id) if org_id is not None else None

    def has_scope(self, scope: str, org_id: int | None = None) -> bool:
        """Whether the actor may act with ``scope`` (in ``org_id`` when given)."""
        if not self.authenticated:
            return False
        if self.token is not None:
            if not self.token.has_scope(scope) and not (scope == Scope.READ):
                return False
            if scope == Scope.AGENT:  # its creator must still belong to the organization
                return self.token.hardware_id is not None and self.token.organization_id in self.roles
            org = org_id if org_id is not None else self.token.organization_id
            role = self.roles.get(org)
            return role is not None and scope in SCOPES_FOR_ROLE[role]
        if self.is_staff:
            return scope != Scope.AGENT
        if scope == Scope.AGENT:
            return False  # agents authenticate with an agent token, never a browser session
        if org_id is not None:
            role = self.roles.get(org_id)
            return role is not None and scope in SCOPES_FOR_ROLE[role]
        return any(scope in SCOPES_FOR_ROLE[role] for role in self.roles.values())

    def is_admin_of(self, org_id: int) -> bool:
        return self.is_staff or self.roles.get(org_id) == Role.ADMIN

    def is_catalog_admin(self) -> bool:
        """May create hardware (it becomes its organization's): staff, or an admin of any organization (through
        a submit token too)."""
        if self.is_staff and self.token is None:
            return True
        if self.token is not None and not self.token.has_scope(Scope.SUBMIT):
            return False
        return any(ROLE_RANK[role] >= ROLE_RANK[Role.ADMIN] for role in self.roles.values())

    def administers_hardware(self, owner_id: int | None) -> bool:
        """May edit a hardware owned by ``owner_id`` and mint its agent tokens: staff (a session), or an admin of
        the owning organization (a session, or a submit token of that organization). A shared catalog entry
        (``owner_id`` None) is staff's only."""
        if self.is_staff and self.token is None:
            return True
        if owner_id is None or (self.token is not None and not self.token.has_scope(Scope.SUBMIT)):
            return False
        return self.roles.get(owner_id) == Role.ADMIN

    @property
    def operates_shared_hardware(self) -> bool:
        """An agent token bound to a shared catalog entry (no owning organization) and minted by a user who is
        still staff: staff operate that hardware's agents, so such a token is handed every job of its queue."""
        token = self.token
        return (token is not None and token.hardware_id is not None and token.hardware.organization_id is None
                and token.user.is_staff)

    def default_org_id(self) -> int | None:
        """The organization new rows belong to: the token's, or the user's one membership with submit rights."""
        if self.token is not None:
            return self.token.organization_id
        writable = [org for org, role in self.roles.items() if Scope.SUBMIT in SCOPES_FOR_ROLE[role]]
        return writable[0] if len(writable) == 1 else None


ANONYMOUS = Actor()


def actor_for(request: HttpRequest) -> Actor:
    """The request's actor, cached on the request (works for DRF requests and plain Django requests)."""
    raw = getattr(request, "_request", request)
    cached = getattr(raw, "_day0_actor", None)
    token = getattr(request, "auth", None)
    if cached is not None and cached.token is (token if isinstance(token, ApiToken) else None):
        return cached
    actor = actor_of(getattr(request, "user", None), token if isinstance(token, ApiToken) else None)
    raw._day0_actor = actor
    return actor


def actor_of(user: object, token: ApiToken | None = None) -> Actor:
    """The actor of a user (a session), or of a token's user acting with that token: a token acts within its
    organization only, and never as staff. Used by requests and by WebSocket connections alike."""
    if user is None or not user.is_authenticated or not user.is_active:
        return ANONYMOUS
    memberships = Membership.objects.filter(user_id=user.pk)
    if token is not None:
        memberships = memberships.filter(organization_id=token.organization_id)
    roles = dict(memberships.values_list("organization_id", "role"))
    return Actor(user_id=user.pk, is_staff=bool(user.is_staff and token is None), token=token, roles=roles)


def actor_username(actor: Actor) -> str | None:
    """The user name behind ``actor`` (None for no user), as records of who did something keep it."""
    return get_user_model().objects.filter(pk=actor.user_id).values_list("username", flat=True).first()
