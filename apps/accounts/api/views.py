from __future__ import annotations

from django.db.models import Q, QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from apps.accounts import services
from apps.accounts.api.mixins import get_actor, get_or_404, require
from apps.accounts.api.serializers import (
    ApiTokenCreateSerializer,
    ApiTokenSerializer,
    InvitationSerializer,
    InvitationWriteSerializer,
    MembershipSerializer,
    MembershipWriteSerializer,
    OrganizationSerializer,
)
from apps.accounts.choices import Role
from apps.accounts.models import ApiToken, Invitation, Organization


def _own_or_administered(request: Request, rows: QuerySet) -> QuerySet:
    """The rows (tokens, invitations) of the signed-in user, and those of the organizations they administer."""
    actor = get_actor(request)
    require(actor.authenticated, actor, "")
    admin_orgs = [org for org, role in actor.roles.items() if role == Role.ADMIN]
    return rows.filter(Q(user_id=actor.user_id) | Q(organization_id__in=admin_orgs))


class ApiTokenViewSet(mixins.ListModelMixin, mixins.CreateModelMixin, viewsets.GenericViewSet):
    """Your tokens (and, for organization admins, the organization's). The secret is shown once, on create."""

    serializer_class = ApiTokenSerializer
    filterset_fields = ["name"]
    ordering_fields = ["created_at", "last_used_at"]

    def get_queryset(self) -> QuerySet[ApiToken]:
        if getattr(self, "swagger_fake_view", False):
            return ApiToken.objects.none()
        return _own_or_administered(self.request, ApiToken.objects.select_related("organization", "hardware", "user"))

    @extend_schema(request=ApiTokenCreateSerializer, responses={201: ApiTokenSerializer})
    def create(self, request: Request, *args, **kwargs) -> Response:
        actor = get_actor(request)
        require(actor.authenticated, actor, "")
        serializer = ApiTokenCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        org = data.get("organization")
        if org is None:
            if len(actor.roles) != 1:
                raise ValidationError({"organization": "is required: name the organization of the token"})
            org = Organization.objects.get(pk=next(iter(actor.roles)))
        hardware = None
        if data.get("hardware"):
            hardware = get_or_404(services.hardware_rows(), "hardware", slug=data["hardware"])
        token, secret = services.check_create_api_token(actor, organization=org, name=data["name"],
                                                        scopes=data["scopes"], hardware=hardware)
        body = dict(ApiTokenSerializer(token).data, token=secret)
        return Response(body, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses=ApiTokenSerializer)
    @action(detail=True, methods=["post"])
    def revoke(self, request: Request, pk: str | None = None) -> Response:
        token = get_or_404(self.get_queryset(), "token", pk=pk)
        services.check_revoke_api_token(get_actor(request), token)
        return Response(ApiTokenSerializer(token).data)


class OrganizationViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Organizations (public list: names publish models)."""

    serializer_class = OrganizationSerializer
    queryset = Organization.objects.all()
    lookup_field = "slug"
    lookup_value_regex = r"[-a-zA-Z0-9_]+"
    search_fields = ["slug", "name"]

    def get_object(self) -> Organization:
        return get_or_404(Organization.objects.all(), "organization", slug=self.kwargs["slug"])

    @extend_schema(methods=["POST"], request=MembershipWriteSerializer, responses=MembershipSerializer(many=True))
    @extend_schema(methods=["GET"], responses=MembershipSerializer(many=True))
    @action(detail=True, methods=["get", "post"])
    def members(self, request: Request, slug: str | None = None) -> Response:
        """GET: the members (for members). POST ``{"username", "role"}`` (admins): change a member's role, or remove
        them with ``"role": null``. Both answer the paginated member list. A user who is not a member joins by
        accepting an invitation (``invitations/``): naming one here is a 400 that says so."""
        org = self.get_object()
        actor = get_actor(request)
        require(actor.authenticated, actor, "")
        members = org.memberships.select_related("user").order_by("user__username", "pk")
        if request.method == "POST":
            serializer = MembershipWriteSerializer(data=request.data)
            serializer.is_valid(raise_exception=True)
            services.check_set_membership(actor, org, username=serializer.validated_data["username"],
                                          role=serializer.validated_data.get("role"))
        elif not (actor.is_staff or org.pk in actor.org_ids):
            require(False, actor, f"only members of {org.slug} see its members")
        page = self.paginate_queryset(members)
        return self.get_paginated_response(MembershipSerializer(page, many=True).data)

    @extend_schema(methods=["POST"], request=InvitationWriteSerializer, responses={201: InvitationSerializer})
    @extend_schema(methods=["GET"], responses=InvitationSerializer(many=True))
    @action(detail=True, methods=["get", "post"])
    def invitations(self, request: Request, slug: str | None = None) -> Response:
        """GET (admins): the organization's invitations, newest first (paginated). POST ``{"username", "role"}``
        (admins): invite a user; they become a member only when they accept (``/api/v1/invitations/{id}/accept/``)."""
        org = self.get_object()
        actor = get_actor(request)
        require(actor.authenticated, actor, "")
        if request.method == "POST":
            serializer = InvitationWriteSerializer(data=request.data)
            serializer.is_valid(raise_exception=True)
            invitation = services.check_invite_member(actor, org, **serializer.validated_data)
            return Response(InvitationSerializer(invitation).data, status=status.HTTP_201_CREATED)
        if not actor.is_admin_of(org.pk):
            require(False, actor, f"only admins of {org.slug} see its invitations")
        page = self.paginate_queryset(org.invitations.select_related("user", "invited_by", "organization"))
        return self.get_paginated_response(InvitationSerializer(page, many=True).data)


class InvitationViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Invitations addressed to you (and, for organization admins, the ones their organizations sent). The
    invitee accepts or declines; an admin declining a pending invitation revokes it."""

    serializer_class = InvitationSerializer
    filterset_fields = ["state"]

    def get_queryset(self) -> QuerySet[Invitation]:
        if getattr(self, "swagger_fake_view", False):
            return Invitation.objects.none()
        return _own_or_administered(self.request, Invitation.objects.select_related("organization", "user",
                                                                                    "invited_by"))

    def get_object(self) -> Invitation:
        return get_or_404(self.get_queryset(), "invitation", pk=self.kwargs["pk"])

    @extend_schema(request=None, responses=InvitationSerializer)
    @action(detail=True, methods=["post"])
    def accept(self, request: Request, pk: str | None = None) -> Response:
        """The invitee joins the organization with the invited role."""
        invitation = self.get_object()
        services.check_accept_invitation(get_actor(request), invitation)
        invitation.refresh_from_db()
        return Response(InvitationSerializer(invitation).data)

    @extend_schema(request=None, responses=InvitationSerializer)
    @action(detail=True, methods=["post"])
    def decline(self, request: Request, pk: str | None = None) -> Response:
        """The invitee declines; an admin of the organization revokes a pending invitation."""
        invitation = services.check_decline_invitation(get_actor(request), self.get_object())
        return Response(InvitationSerializer(invitation).data)
