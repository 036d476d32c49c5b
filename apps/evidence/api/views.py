"""The evidence API: ``POST jobs/{id}/results/`` (agent: a job's stage results, stored as evidence by ``ingest``)
and ``POST models/{slug}/manifest/settle/`` (staff: a release's manifest from a hardware's load digests)."""

from __future__ import annotations

from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.accounts.api.mixins import get_actor, get_or_404, require
from apps.catalog.api.serializers import ModelReleaseSerializer
from apps.catalog.engines import engine_for_spec
from apps.catalog.selectors import visible_models
from apps.evidence import ingest
from apps.evidence.manifests import check_settle_manifest
from apps.jobs.selectors import visible_jobs


class JobResultsView(APIView):
    """A job's results, posted by the agent that runs it; the answer names the stored sections and the cell."""

    @extend_schema(request=OpenApiTypes.OBJECT, responses=OpenApiTypes.OBJECT, operation_id="jobs_results_create",
                   parameters=[OpenApiParameter("id", int, OpenApiParameter.PATH, description="the job's id")])
    def post(self, request: Request, pk: str) -> Response:
        """POST (agent): one stage's section ``{"stage", "section", "attempt", "nonce"}`` or a whole stage report
        with ``attempt`` and ``nonce`` beside ``stages``: bound to the job's current attempt (409 otherwise)."""
        if not str(pk).isdecimal():
            raise ValidationError({"id": f"job ids are integers, got {pk!r}"})
        actor = get_actor(request)
        job = get_or_404(visible_jobs(actor), "job", pk=int(pk))
        require(actor.authenticated, actor, "")
        results = ingest.check_record_job_results(actor, job, request.data)
        # the matrix's cell of the job's engine, through its relation
        cell = job.model.cells.get(hardware_id=job.hardware_id, engine=engine_for_spec(job.spec))
        return Response({"job": job.pk, "stored": [r.summary() for r in results],
                         "cell": {"tier": cell.tier, "tier_name": cell.tier_name, "failed_stage": cell.failed_stage,
                                  "error": cell.error, "custom_thresholds": cell.custom_thresholds,
                                  "disputed": cell.disputed}},
                        status=status.HTTP_201_CREATED)


class SettleManifestView(APIView):
    """A release's manifest settled by staff where its hardware loaded different bytes."""

    @extend_schema(request=OpenApiTypes.OBJECT, responses=ModelReleaseSerializer,
                   operation_id="models_manifest_settle_create")
    def post(self, request: Request, slug: str) -> Response:
        """POST (staff): ``{"hardware": slug}`` makes that hardware's newest passing load's digests the release's
        manifest, or ``{"manifest": [{name, size, sha256}]}`` gives one (``manifest_source`` "staff"); the
        disagreement between hardware is then settled."""
        actor = get_actor(request)
        model = get_or_404(visible_models(actor), "model", slug=slug)
        require(actor.is_staff, actor, "settling a release's manifest needs staff")
        body = request.data if isinstance(request.data, dict) else {}
        hardware = body.get("hardware")
        if hardware is not None and not isinstance(hardware, str):
            raise ValidationError({"hardware": "must be a hardware slug"})
        try:
            model = check_settle_manifest(actor, model, hardware=hardware, manifest=body.get("manifest"))
        except DjangoValidationError as exc:
            raise ValidationError(exc.message_dict) from None
        return Response(ModelReleaseSerializer(model).data)
