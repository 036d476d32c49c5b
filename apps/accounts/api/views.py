from __future__ import annotations

from django.db.models import Q
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from apps.accounts import services
from apps.accounts.api.serializers import ApiTokenCreateSerializer, ApiTokenSerializer, OrganizationSerializer
from apps.accounts.choices import Role
from apps.accounts.models import ApiToken, Organization
from apps.catalog.models import Hardware
from apps.core.api.mixins import get_actor, get_or_404, require


class ApiTokenViewSet(mixins.ListModelMixin, mixins.CreateModelMixin, viewsets.GenericViewSet):
    """Your tokens (and, for organization admins, the organization's). The secret is shown once, on create."""

    serializer_class = ApiTokenSerializer
    filterset_fields = ["name"]
    ordering_fields = ["created_at", "last_used_at"]

    def get_queryset(self):  # noqa: ANN201
        actor = get_actor(self.request)
        require(actor.authenticated, actor, "")
        admin_orgs = [org for org, role in actor.roles.items() if role == Role.ADMIN]
        return ApiToken.objects.filter(Q(user_id=actor.user_id) | Q(organization_id__in=admin_orgs)).select_related(
            "organization", "hardware", "user")

    def create(self, request: Request, *args, **kwargs) -> Response:  # noqa: ANN002, ANN003
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
        hardware_id = None
        if data.get("hardware"):
            hardware_id = get_or_404(Hardware.objects.all(), "hardware", slug=data["hardware"]).pk
        token, secret = services.check_create_api_token(actor, organization=org, name=data["name"],
                                                        scopes=data["scopes"], hardware_id=hardware_id)
        body = dict(ApiTokenSerializer(token).data, token=secret)
        return Response(body, status=status.HTTP_201_CREATED)

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
    search_fields = ["slug", "name"]
