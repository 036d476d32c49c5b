"""The matrix page (server-rendered, works without JavaScript) and a plain cell evidence page."""

from __future__ import annotations

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils.safestring import mark_safe

from agents.pipeline.tiers import TIER_NAMES
from apps.accounts.access import actor_for
from apps.catalog.models import Hardware
from apps.catalog.selectors import visible_models
from apps.evidence.selectors import cell_evidence
from apps.matrix.models import Cell
from apps.matrix.presenters import human_count, rows_html
from apps.matrix.selectors import MatrixFilters, build_matrix, family_choices, vendor_choices


def matrix_page(request: HttpRequest) -> HttpResponse:
    filters = MatrixFilters.from_params(request.GET)
    matrix = build_matrix(actor_for(request), filters)
    rows = [
        {"model": m, "params": f"{human_count(m.params_total)} / {human_count(m.params_active)} active"
         if m.params_active != m.params_total else human_count(m.params_total),
         "cells": mark_safe(html)}  # noqa: S308 - built from escaped values in presenters
        for m, html in zip(matrix.models, rows_html(matrix.models, matrix.hardware, matrix.cells), strict=True)
    ]
    return render(request, "matrix/matrix.html", {
        "rows": rows, "hardware": matrix.hardware, "filters": filters, "tiers": sorted(TIER_NAMES.items()),
        "vendors": vendor_choices(), "families": family_choices(),
    })


def cell_page(request: HttpRequest, model: str, hardware: str) -> HttpResponse:
    model_row = visible_models(actor_for(request)).filter(slug=model).first()
    hardware_row = Hardware.objects.filter(slug=hardware).first()
    if model_row is None or hardware_row is None:
        raise Http404(f"no cell {model} × {hardware}")
    cell = Cell.objects.filter(model=model_row, hardware=hardware_row).select_related("last_job").first()
    return render(request, "matrix/cell.html", {
        "model": model_row, "hardware": hardware_row, "cell": cell,
        "evidence": cell_evidence(model_row.pk, hardware_row.pk),
        "jobs": model_row.jobs.filter(hardware=hardware_row).order_by("-created_at")[:20],
        "tier_names": TIER_NAMES,
    })
