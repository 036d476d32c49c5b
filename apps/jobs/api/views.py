from __future__ import annotations

import django_filters
from django.conf import settings
from django.db.models import QuerySet
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from apps.accounts.api.mixins import get_actor, get_or_404, require
from apps.accounts.choices import Scope
from apps.catalog.models import Hardware
from apps.catalog.selectors import visible_models
from apps.jobs import eventlog, node_services, services
from apps.jobs.api.serializers import (
    JobCreateSerializer,
    JobEventSerializer,
    JobNodeStateSerializer,
    JobSerializer,
    JobStateSerializer,
)
from apps.jobs.models import Job, JobNode
from apps.jobs.selectors import job_events_after, visible_jobs

EVENTS_PAGE_DEFAULT = 500
EVENTS_PAGE_MAX = 5000


class JobFilter(django_filters.FilterSet):
    model = django_filters.CharFilter(field_name="model__slug")
    hardware = django_filters.CharFilter(field_name="hardware__slug")

    class Meta:
        model = Job
        fields = ["state", "model", "hardware"]


def _int_param(request: Request, name: str, default: int, *, minimum: int = 0, maximum: int | None = None) -> int:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise ValidationError({name: f"must be an integer, got {raw!r}"}) from exc
    if value < minimum or (maximum is not None and value > maximum):
        raise ValidationError({name: f"must be between {minimum} and {maximum}"})
    return value


class JobViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Adaptation jobs: submit, list, follow, cancel; agents post events and state here (results: ``POST
    jobs/{id}/results/``, ``apps.evidence.api``)."""

    serializer_class = JobSerializer
    filterset_class = JobFilter
    ordering_fields = ["created_at", "finished_at", "state"]

    def get_queryset(self) -> QuerySet[Job]:
        return visible_jobs(get_actor(self.request))

    def get_object(self) -> Job:
        pk = self.kwargs["pk"]
        if not str(pk).isdecimal():
            raise ValidationError({"id": f"job ids are integers, got {pk!r}"})
        return get_or_404(self.get_queryset(), "job", pk=int(pk))

    @extend_schema(request=JobCreateSerializer, responses={201: JobSerializer})
    def create(self, request: Request) -> Response:
        actor = get_actor(request)
        require(actor.has_scope(Scope.SUBMIT), actor, "creating a job needs the submit scope")
        serializer = JobCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        model = visible_models(actor).filter(slug=data["model"]).first()
        if model is None:
            raise ValidationError({"model": f"no model with slug {data['model']!r}"})
        hardware = Hardware.objects.select_related("organization").filter(slug=data["hardware"]).first()
        if hardware is None:
            raise ValidationError({"hardware": f"no hardware with slug {data['hardware']!r}"})
        spec = serializer.spec()
        job = services.check_create_job(actor, model=model, hardware=hardware, spec=spec)
        return Response(JobSerializer(job).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses=JobSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        job = self.get_object()
        actor = get_actor(request)
        require(actor.authenticated, actor, "")
        services.check_cancel_job(actor, job)
        return Response(JobSerializer(job).data)

    @extend_schema(methods=["GET"], responses=OpenApiTypes.OBJECT, parameters=[
        OpenApiParameter("after", int, description="events with seq greater than this"),
        OpenApiParameter("node", int, description="the sequence of this node of a multi-node job (default 0: the "
                                                  "job's own; another node's events are numbered apart)"),
        OpenApiParameter("limit", int, description=f"at most this many (default {EVENTS_PAGE_DEFAULT})")])
    @extend_schema(methods=["POST"], request=JobEventSerializer(many=True), responses=OpenApiTypes.OBJECT,
                   description="A batch of events; answers {\"acked\": highest contiguous seq stored}.")
    @action(detail=True, methods=["get", "post"])
    def events(self, request: Request, pk: str | None = None) -> Response:
        """GET ``?after=SEQ&limit=N[&node=R]``: events of node R's sequence (0, the job's own, by default) in
        seq order. POST (agent of node 0): a batch, stored idempotently."""
        job = self.get_object()
        if request.method == "POST":
            actor = get_actor(request)
            require(actor.authenticated, actor, "")
            services.check_agent_for_job(actor, job, reporting=True)
            services.check_event_log_open(job)
            events = eventlog.parse_event_batch(request.data, max_events=settings.EVENT_BATCH_MAX)
            eventlog.check_event_stages(job, events)
            acked = eventlog.do_store_job_events(job, events)
            return Response({"acked": acked})
        after = _int_param(request, "after", 0)
        limit = _int_param(request, "limit", EVENTS_PAGE_DEFAULT, minimum=1, maximum=EVENTS_PAGE_MAX)
        node = _int_param(request, "node", 0, maximum=max(job.nodes - 1, 0))
        rows = job_events_after(job, after, limit + 1, node=node)
        has_more = len(rows) > limit
        rows = rows[:limit]
        # another node's sequence is numbered by the portal in arrival order: contiguous, its highest is acked
        acked = job.events_acked if node == 0 else node_services.node_stream_seq(job.pk, node)
        return Response({
            "job": job.pk, "node": node, "state": job.state, "acked": acked,
            "events": JobEventSerializer(rows, many=True).data,
            "next_after": rows[-1].seq if rows else after, "has_more": has_more,
        })

    @extend_schema(request=JobNodeStateSerializer, responses=OpenApiTypes.OBJECT)
    @action(detail=True, methods=["post"], url_path=r"nodes/(?P<rank>[0-9]{1,4})")
    def node_state(self, request: Request, pk: str | None = None, rank: str = "0") -> Response:
        """POST (agent of node ``rank`` > 0): ``{"state": "running", "attempt"}`` claims its reservation;
        ``{"state": "finished" | "failed", "error"}`` says how its ranks ended."""
        job = self.get_object()
        actor = get_actor(request)
        require(actor.authenticated, actor, "")
        serializer = JobNodeStateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        node = node_services.check_agent_node_state(actor, job, int(rank), data["state"], attempt=data.get("attempt"),
                                                    error=data.get("error") or "")
        return Response({"job": job.pk, "rank": node.rank, "attempt": node.attempt, "state": node.state,
                         "events_acked": node.events_acked})

    @extend_schema(methods=["GET"], responses=OpenApiTypes.OBJECT)
    @extend_schema(methods=["POST"], request=JobEventSerializer(many=True), responses=OpenApiTypes.OBJECT)
    @action(detail=True, methods=["get", "post"], url_path=r"nodes/(?P<rank>[0-9]{1,4})/events")
    def node_events(self, request: Request, pk: str | None = None, rank: str = "0") -> Response:
        """GET: node ``rank``'s stage events at the job's current attempt ``{"rank", "attempt", "events"}``.
        POST (agent of node ``rank`` > 0): a batch of its stage events in its own seqs; answers ``{"acked"}``."""
        job = self.get_object()
        if request.method == "GET":
            node = JobNode.objects.filter(job=job, attempt=job.attempts, rank=int(rank)).first()
            if node is None:
                raise NotFound(f"job {job.pk} has no node {rank} at attempt {job.attempts}")
            return Response({"rank": node.rank, "attempt": node.attempt, "state": node.state, "events": node.events})
        actor = get_actor(request)
        require(actor.authenticated, actor, "")
        events = eventlog.parse_event_batch(request.data, max_events=settings.EVENT_BATCH_MAX)
        return Response({"acked": node_services.check_store_node_events(actor, job, int(rank), events)})

    @extend_schema(request=JobStateSerializer, responses=JobSerializer)
    @action(detail=True, methods=["post"])
    def state(self, request: Request, pk: str | None = None) -> Response:
        """POST (agent): ``{"state": "running", "agent", "attempt"}`` claims a dispatched job; ``{"state":
        "succeeded" | "failed", "failed_stage", "error", "agent"}`` finishes the job the agent claimed."""
        job = self.get_object()
        actor = get_actor(request)
        require(actor.authenticated, actor, "")
        serializer = JobStateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        services.check_agent_transition_job(actor, job, data["state"], agent_id=data.get("agent"),
                                            attempt=data.get("attempt"), failed_stage=data.get("failed_stage"),
                                            error=data.get("error"))
        return Response(JobSerializer(job).data)
