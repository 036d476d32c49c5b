from __future__ import annotations

from django.db.models import Q, QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from apps.accounts.api.mixins import get_actor, get_or_404, require
from apps.fleet import services
from apps.fleet.api.serializers import AgentRegisterSerializer, AgentSerializer, HeartbeatSerializer
from apps.fleet.models import Agent


class AgentViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Agents. POST registers (agent token); ``{id}/heartbeat/`` keeps it online. A member sees the agents
    registered with its organization's tokens; staff see all."""

    serializer_class = AgentSerializer
    filterset_fields = ["hostname"]
    ordering_fields = ["last_heartbeat_at", "hostname"]

    def get_queryset(self) -> QuerySet[Agent]:
        if getattr(self, "swagger_fake_view", False):
            return Agent.objects.none()
        actor = get_actor(self.request)
        require(actor.authenticated, actor, "")
        qs = Agent.objects.select_related("hardware")
        if not actor.is_staff:  # agent hosts are a vendor's infrastructure: its organization's only
            visible = Q(token__organization_id__in=sorted(actor.org_ids))
            if actor.hardware_id is not None:
                visible |= Q(hardware_id=actor.hardware_id)
            qs = qs.filter(visible)
        hardware = self.request.query_params.get("hardware")
        return qs.filter(hardware__slug=hardware) if hardware else qs

    def get_object(self) -> Agent:
        pk = self.kwargs["pk"]
        return get_or_404(self.get_queryset(), "agent", pk=int(pk) if str(pk).isdecimal() else -1)

    @extend_schema(request=AgentRegisterSerializer, responses={201: AgentSerializer, 200: AgentSerializer})
    def create(self, request: Request) -> Response:
        actor = get_actor(request)
        require(actor.authenticated, actor, "")
        serializer = AgentRegisterSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        agent, created = services.check_register_agent(
            actor, hardware_slug=data.get("hardware"), hostname=data["hostname"],
            capabilities=data.get("capabilities") or {}, versions=data.get("versions") or {},
        )
        return Response(AgentSerializer(agent).data, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    @extend_schema(request=HeartbeatSerializer, responses=AgentSerializer)
    @action(detail=True, methods=["post"])
    def heartbeat(self, request: Request, pk: str | None = None) -> Response:
        agent = self.get_object()
        serializer = HeartbeatSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        services.check_heartbeat_agent(get_actor(request), agent,
                                       current_job_id=serializer.validated_data.get("current_job"),
                                       versions=serializer.validated_data.get("versions"))
        return Response(AgentSerializer(agent).data)
