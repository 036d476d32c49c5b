from __future__ import annotations

from django.db.models import Q, QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from apps.accounts import services
from apps.accounts.api.serializers import (
    ApiTokenCreateSerializer,
    ApiTokenSerializer,
    MembershipSerializer,
    MembershipWriteSerializer,
    OrganizationSerializer,
)
from apps.accounts.choices import Role
from apps.accounts.models import ApiToken, Organization
from apps.catalog.models import Hardware
from apps.core.api.mixins import get_actor, get_or_404, require


class ApiTokenViewSet(mixins.ListModelMixin, mixins.CreateModelMixin, viewsets.GenericViewSet):
    """Your tokens (and, for organization admins, the organization's). The secret is shown once, on create."""

    serializer_class = ApiTokenSerializer
    filterset_fields = ["name"]
    ordering_fields = ["created_at", "last_used_at"]

    def get_queryset(self) -> QuerySet[ApiToken]:
        if getattr(self, "swagger_fake_view", False):
            return ApiToken.objects.none()
        actor = get_actor(self.request)
        require(actor.authenticated, actor, "")
        admin_orgs = [org for org, role in actor.roles.items() if role == Role.ADMIN]
        return ApiToken.objects.filter(Q(user_id=actor.user_id) | Q(organization_id__in=admin_orgs)).select_related(
            "organization", "hardware", "user")

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
            hardware = get_or_404(Hardware.objects.select_related("organization"), "hardware", slug=data["hardware"])
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
        """GET: the members (for members). POST ``{"username", "role"}`` (admins): add, change, or remove with
        ``"role": null``."""
        org = self.get_object()
        actor = get_actor(request)
        require(actor.authenticated, actor, "")
        if request.method == "POST":
            serializer = MembershipWriteSerializer(data=request.data)
            serializer.is_valid(raise_exception=True)
            services.check_set_membership(actor, org, username=serializer.validated_data["username"],
                                          role=serializer.validated_data.get("role"))
        elif not (actor.is_staff or org.pk in actor.org_ids):
            require(False, actor, f"only members of {org.slug} see its members")
        members = org.memberships.select_related("user").order_by("user__username")
        return Response(MembershipSerializer(members, many=True).data)
