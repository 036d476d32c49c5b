from __future__ import annotations

from datetime import datetime
from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.accounts.api.mixins import get_actor, get_or_404
from apps.catalog.engines import default_engine, engine_jobs_q, resolve_engine
from apps.catalog.models import Hardware
from apps.catalog.selectors import visible_models
from apps.evidence.conformance import conformance_evidence
from apps.evidence.manifests import digest_disagreement
from apps.evidence.runtime_evidence import runtime_evidence
from apps.evidence.selectors import cell_evidence, newest_results
from apps.jobs.api.serializers import JobSerializer
from apps.jobs.models import Job
from apps.matrix import grid_cache
from apps.matrix.api.matrix_json import matrix_data, matrix_pieces
from apps.matrix.api.serializers import CellDetailSerializer
from apps.matrix.history import cell_history
from apps.matrix.models import Cell
from apps.matrix.selectors import FilterError, MatrixFilters, lead_hours
from apps.matrix.series import engine_cells
from apps.matrix.stacks import cell_stack
from contract.manifest import LEGACY_SOURCES
from contract.tiers import TIER_NAMES

API_PAGE_SIZE, API_PAGE_SIZE_MAX = 50, 1000


def parse_filters(params: Any) -> MatrixFilters:
    """``?vendor=&family=&tier=&engine=``; a bad tier or engine is a 400 naming what is accepted."""
    try:
        return MatrixFilters.from_params(params, strict=True)
    except FilterError as exc:
        raise ValidationError({exc.field: str(exc)}) from None


def _page_param(params: Any, name: str, default: int, most: int) -> int:
    raw = (params.get(name) or "").strip()
    if not raw:
        return default
    if not raw.isdecimal() or not 1 <= int(raw) <= most:
        raise ValidationError({name: f"must be a whole number from 1 to {most}"})
    return int(raw)


class MatrixView(APIView):
    """The whole matrix: one row per visible model (newest release first), one cell per hardware; with ``page``
    or ``page_size``, one page of rows and a ``page`` key. The JSON is cached per viewer scope and query until a
    cell, model or hardware changes (``apps.matrix.grid_cache``)."""

    @extend_schema(responses=OpenApiTypes.OBJECT, parameters=[
        OpenApiParameter("vendor", str, description="only hardware of this vendor"),
        OpenApiParameter("family", str, description="only models of this family (llama, qwen3, deepseek_v3 …)"),
        OpenApiParameter("tier", str, description="only models reaching at least this tier on some hardware "
                                                  "(0-6 or its name)"),
        OpenApiParameter("engine", str, description="only this engine's cells, NAME (every version) or "
                                                    "NAME@VERSION; without it each cell is the best engine's, with "
                                                    "'engine' and every engine's tier in 'engines'"),
        OpenApiParameter("page", int, description="optional: this page of rows (from 1), with a 'page' key "
                                                  "{number, size, pages, count}; without it every row"),
        OpenApiParameter("page_size", int, description=f"optional: rows per page (1-{API_PAGE_SIZE_MAX}, default "
                                                       f"{API_PAGE_SIZE}); implies page=1"),
    ])
    def get(self, request: Request) -> Response | HttpResponse:
        actor = get_actor(request)
        filters = parse_filters(request.query_params)
        params = request.query_params
        paged = "page" in params or "page_size" in params
        number = _page_param(params, "page", 1, 10**6) if paged else None
        size = _page_param(params, "page_size", API_PAGE_SIZE, API_PAGE_SIZE_MAX)
        if getattr(request.accepted_renderer, "format", "") != "json":  # the browsable API renders the data
            return Response(matrix_data(actor, filters, number, size))
        parts = [filters.vendor, filters.family, filters.min_tier, number, size if paged else None, filters.engine]
        body = grid_cache.cached_pieces("api", actor, parts, lambda: matrix_pieces(actor, filters, number, size))
        return HttpResponse(body, content_type="application/json")


class CellDetailView(APIView):
    """A cell's evidence: tier, fits estimate, the newest result of each stage, checklist, alignment,
    benchmarks and jobs; ``runtime_evidence``: what the cell page shows of the runtime (the same selector)."""

    @extend_schema(responses=CellDetailSerializer, parameters=[
        OpenApiParameter("engine", str, description="the engine's cell, NAME or NAME@VERSION (default: the bundled "
                                                    "runtime, day0); 'engines' lists every engine's cell"),
    ])
    def get(self, request: Request, model: str, hardware: str) -> Response:
        actor = get_actor(request)
        model_row = get_or_404(visible_models(actor), "model", slug=model)
        hardware_row = get_or_404(Hardware.objects.all(), "hardware", slug=hardware)
        raw = (request.query_params.get("engine") or "").strip()
        try:
            engine = resolve_engine(raw) if raw else default_engine()
        except DjangoValidationError as exc:
            raise ValidationError({"engine": exc.message_dict.get("engine", [str(exc)])}) from None
        cell = Cell.objects.filter(model=model_row, hardware=hardware_row, engine=engine).first()
        if cell is None:  # an engine without a job here, or a half-seeded catalog: the cell as it would start
            cell = Cell(model=model_row, hardware=hardware_row, engine=engine)
        reached = {int(k): v for k, v in (cell.tier_reached_at or {}).items()}
        lead = {TIER_NAMES[t]: lead_hours(datetime.fromisoformat(at), model_row.released_at)
                for t, at in sorted(reached.items())}
        jobs = Job.objects.filter(engine_jobs_q(engine), model=model_row, hardware=hardware_row).select_related(
            "model", "hardware", "organization", "requested_by")[:20]
        return Response({
            "model": model_row.slug, "hardware": hardware_row.slug,
            "engine": engine.ref,  # whose cell this is; every engine's, best first:
            "engines": [e.as_dict() for e in engine_cells(model_row.pk, hardware_row.pk)],
            "tier": cell.tier, "tier_name": cell.tier_name,
            "failed_stage": cell.failed_stage or None, "error": cell.error or None,
            "stage_passed": cell.stage_passed,
            "verdicts": cell.verdicts,
            "disputed": cell.disputed,
            "custom_thresholds": cell.custom_thresholds,
            "synthetic": cell.synthetic,
            "manifest": {"files": len(model_row.manifest or []), "source": model_row.manifest_source or None,
                         "from": model_row.manifest_seen or None,  # job, hardware, by, at
                         "first_seen": model_row.manifest_seen or None if model_row.manifest_source in LEGACY_SOURCES
                         else None},
            "digest_conflict": digest_disagreement(model_row),
            "tier_reached_at": {TIER_NAMES[t]: at for t, at in sorted(reached.items())},
            "lead_time_hours": lead,
            "fits": {"fits": cell.fits, "devices": cell.fits_devices, "plan": cell.fits_plan,
                     "error": cell.fits_error or None},
            "evidence": cell_evidence(model_row.pk, hardware_row.pk, engine_jobs_q(engine, "job__")),
            "runtime_evidence": runtime_evidence(model_row.pk, hardware_row.pk),
            # the conformance rows, target beside reference, each recomputed by the portal (its verdict: above)
            "conformance": conformance_evidence(newest_results(model_row.pk, hardware_row.pk).get("conformance")),
            "stack": cell_stack(model_row.pk, hardware_row.pk),  # evidence's stack, stale since a change
            "jobs": JobSerializer(jobs, many=True).data,
            # tier changes and re-judgings, newest first, each with its reason
            "history": cell_history(cell) if cell.pk else [],
        })
