"""``/api/v1/models/{slug}/reference/``: a release's reference runs (their state, never their outputs) and, for
staff, queueing one."""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.accounts.api.mixins import get_actor, get_or_404, require
from apps.catalog.selectors import visible_models
from apps.references.models import ReferenceRun
from apps.references.services import do_queue_reference
from contract.challenges import pool as cp


def _run(run: ReferenceRun) -> dict[str, Any]:
    return {"id": run.pk, "state": run.state, "pool_version": run.pool_version, "job": run.job_id,
            "created_at": run.created_at, "finished_at": run.finished_at, "error": run.error}


class ReferenceView(APIView):
    """GET: the release's reference runs and the current pool version. POST (staff session): queue a reference
    run on reference hardware, ``{"model_path": "..."}`` (default: the release's ``reference_source``)."""

    @extend_schema(responses=OpenApiTypes.OBJECT)
    def get(self, request: Request, slug: str) -> Response:
        actor = get_actor(request)
        require(actor.authenticated, actor, "")
        release = get_or_404(visible_models(actor), "model", slug=slug)
        runs = ReferenceRun.objects.filter(release=release).order_by("-created_at", "-id")[:20]
        return Response({"model": release.slug, "pool_version": cp.pool().version, "runs": [_run(r) for r in runs]})

    @extend_schema(request=OpenApiTypes.OBJECT, responses=OpenApiTypes.OBJECT)
    def post(self, request: Request, slug: str) -> Response:
        actor = get_actor(request)
        require(actor.is_staff, actor, "queueing a reference run is staff's (a staff session)")
        release = get_or_404(visible_models(actor), "model", slug=slug)
        data = request.data if isinstance(request.data, dict) else {}
        path = data.get("model_path")
        if path is not None and (not isinstance(path, str) or not path.strip() or len(path) > 500
                                 or any(ord(c) < 32 for c in path)):
            raise ValidationError({"model_path": "must be a path or a hub id the reference host can read (at most "
                                                 "500 characters, no control characters)"})
        run = do_queue_reference(release, source=path, requested_by_id=actor.user_id, again=True)
        return Response({"model": release.slug, **_run(run)}, status=status.HTTP_201_CREATED)
