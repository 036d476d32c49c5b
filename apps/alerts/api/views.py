from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from apps.accounts.access import Actor
from apps.accounts.api.mixins import get_actor, get_or_404, require
from apps.accounts.choices import Role
from apps.accounts.models import Organization
from apps.alerts import services
from apps.alerts.api.serializers import (
    DeliverySerializer,
    StackChangeSerializer,
    StackPolicyWriteSerializer,
    SubscriptionCreatedSerializer,
    SubscriptionSerializer,
    SubscriptionWriteSerializer,
)
from apps.alerts.models import Delivery, Subscription
from apps.catalog.models import Hardware
from apps.fleet import stacks
from apps.fleet.choices import RevalidationPolicy
from apps.fleet.models import HardwarePolicy, HardwareStack, StackChange


def _administered(actor: Actor) -> list[int] | None:
    """Organizations whose alerts the actor manages; None for staff (all)."""
    require(actor.authenticated, actor, "")
    if actor.is_staff and actor.token is None:
        return None
    return [org for org, role in actor.roles.items() if role == Role.ADMIN]


def _body(request: Request) -> dict[str, Any]:
    if not isinstance(request.data, dict):
        raise ValidationError({"detail": "the body must be a JSON object"})
    return dict(request.data)


class SubscriptionViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.DestroyModelMixin,
                          viewsets.GenericViewSet):
    """Alert webhooks of the organizations you administer. The secret is answered once, by the create."""

    serializer_class = SubscriptionSerializer
    ordering_fields = ["created_at", "name"]

    def get_queryset(self) -> QuerySet[Subscription]:
        if getattr(self, "swagger_fake_view", False):
            return Subscription.objects.none()
        rows = Subscription.objects.select_related("organization")
        orgs = _administered(get_actor(self.request))
        return rows if orgs is None else rows.filter(organization_id__in=orgs)

    @extend_schema(request=SubscriptionWriteSerializer, responses={201: SubscriptionCreatedSerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        actor = get_actor(request)
        fields = _body(request)
        slug = fields.pop("organization", None)
        if slug is None:
            orgs = _administered(actor) or list(actor.roles)
            if len(orgs) != 1:
                raise ValidationError({"organization": "is required: name the organization (its slug)"})
            organization = Organization.objects.get(pk=orgs[0])
        else:
            organization = get_or_404(Organization.objects.all(), "organization", slug=str(slug))
        sub, secret = services.check_create_subscription(actor, organization=organization, fields=fields)
        body = dict(SubscriptionSerializer(sub).data, secret=secret)
        return Response(body, status=status.HTTP_201_CREATED)

    @extend_schema(request=SubscriptionWriteSerializer, responses=SubscriptionSerializer)
    def partial_update(self, request: Request, pk: str | None = None) -> Response:
        sub = self.get_object()
        fields = _body(request)
        if "organization" in fields:
            raise ValidationError({"organization": "cannot be changed; create a subscription in the other one"})
        sub = services.check_update_subscription(get_actor(request), sub, fields)
        return Response(SubscriptionSerializer(sub).data)

    def perform_destroy(self, instance: Subscription) -> None:
        services.check_delete_subscription(get_actor(self.request), instance)


class DeliveryViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """The delivery log of your organizations' subscriptions: status, attempts, response code, last error."""

    serializer_class = DeliverySerializer
    filterset_fields = ["subscription", "status", "kind"]
    ordering_fields = ["created_at"]

    def get_queryset(self) -> QuerySet[Delivery]:
        if getattr(self, "swagger_fake_view", False):
            return Delivery.objects.none()
        rows = Delivery.objects.select_related("subscription__organization", "model", "hardware")
        orgs = _administered(get_actor(self.request))
        return rows if orgs is None else rows.filter(subscription__organization_id__in=orgs)

    @extend_schema(request=None, responses=DeliverySerializer)
    @action(detail=True, methods=["post"])
    def redeliver(self, request: Request, pk: str | None = None) -> Response:
        delivery = get_or_404(self.get_queryset(), "delivery", pk=pk)
        delivery = services.check_redeliver(get_actor(request), delivery)
        return Response(DeliverySerializer(delivery).data, status=status.HTTP_202_ACCEPTED)


class StackPolicyViewSet(viewsets.ViewSet):
    """``stack-policies/{hardware}/``: what a stack change of the hardware re-validates (``off``, ``tier`` with
    ``min_tier``, ``all``), and its stack changes. PUT by those who edit the hardware."""

    lookup_field = "hardware"
    lookup_value_regex = r"[A-Za-z0-9][A-Za-z0-9._-]*"

    def _hardware(self, slug: str) -> Hardware:
        """The hardware, for a signed-in actor; an organization's pool (its stack is its infrastructure) only
        for its members and staff."""
        actor = get_actor(self.request)
        require(actor.authenticated, actor, "")
        hardware = get_or_404(Hardware.objects.select_related("organization"), "hardware", slug=slug)
        owner = hardware.organization_id
        if owner is not None and owner not in actor.org_ids and not actor.is_staff:
            raise NotFound(f"no hardware with slug {slug!r}")
        return hardware

    def _answer(self, hardware: Hardware) -> Response:
        row = HardwarePolicy.objects.filter(hardware=hardware).first()
        changes = StackChange.objects.filter(hardware=hardware).order_by("-created_at", "-id")[:20]
        return Response({"hardware": hardware.slug, "policy": row.policy if row else RevalidationPolicy.OFF,
                         "min_tier": row.min_tier if row else 1,
                         "stack": getattr(HardwareStack.objects.filter(hardware=hardware).first(), "lock", None),
                         "changes": StackChangeSerializer(changes, many=True).data})

    @extend_schema(responses=OpenApiTypes.OBJECT)
    def retrieve(self, request: Request, hardware: str | None = None) -> Response:
        return self._answer(self._hardware(str(hardware)))

    @extend_schema(request=StackPolicyWriteSerializer, responses=OpenApiTypes.OBJECT)
    def update(self, request: Request, hardware: str | None = None) -> Response:
        row = self._hardware(str(hardware))
        body = _body(request)
        stacks.check_set_hardware_policy(get_actor(request), row, policy=body.get("policy"),
                                         min_tier=body.get("min_tier", 1))
        return self._answer(row)
