"""The matrix page (server-rendered, works without JavaScript; static/js/matrix_filters.js applies the search
and filters as they change). The cell page is apps.dashboards'."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlencode

from django.core.cache import cache
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils.safestring import mark_safe

from agents.pipeline.tiers import TIER_NAMES
from agents.runtime.planner.memory import DTYPES
from apps.accounts.access import actor_for
from apps.benchmarks.open_regressions import open_regressions
from apps.catalog.models import Hardware, ModelRelease
from apps.matrix.presenters import dtype_short, human_count, rows_html
from apps.matrix.selectors import Matrix, MatrixFilters, build_matrix, family_choices, vendor_choices
from apps.matrix.services import estimate_fit

PLAN_DTYPES = tuple(DTYPES)  # the formats the planner knows
FIT_CACHE_SECONDS = 3600


@dataclass(frozen=True)
class PageOptions:
    """The page's own parameters beyond the matrix filters: search, the planned dtype, regressed rows only."""

    q: str = ""
    dtype: str = ""  # "" = each checkpoint's own format (the stored estimate)
    regressed: bool = False

    @classmethod
    def from_params(cls, params: object) -> PageOptions:
        get = params.get  # type: ignore[attr-defined]
        dtype = (get("dtype") or "").strip()
        return cls(q=(get("q") or "").strip()[:100], dtype=dtype if dtype in PLAN_DTYPES else "",
                   regressed=get("regressed") in ("1", "on", "true"))


def replan(matrix: Matrix, dtype: str) -> None:
    """Replaces the cells' fits by estimates in ``dtype`` (the switch "plan another dtype"); each estimate is
    cached per model, hardware, their last change and the dtype."""
    if not matrix.models or not matrix.hardware:
        return
    configs = {pk: (config, updated) for pk, config, updated in ModelRelease.objects.filter(
        pk__in=[m.pk for m in matrix.models]).values_list("pk", "config", "updated_at")}
    hardware = list(Hardware.objects.filter(pk__in=[h.pk for h in matrix.hardware]))
    keys = {(m.pk, h.pk): f"fit:{m.pk}:{configs[m.pk][1].timestamp()}:{h.pk}:{h.updated_at.timestamp()}:{dtype}"
            for m in matrix.models for h in hardware}
    cached = cache.get_many(list(keys.values()))
    fresh = {}
    for m in matrix.models:
        m.config = configs[m.pk][0]
        for h in hardware:
            cell = matrix.cells.get((m.pk, h.pk))
            if cell is None:
                continue
            key = keys[(m.pk, h.pk)]
            fit = cached.get(key)
            if fit is None:
                estimate = estimate_fit(m, h, dtype)
                fit = fresh[key] = (estimate["fits"], estimate["fits_devices"],
                                    (estimate["fits_plan"] or {}).get("dtype") or dtype)
            cell.fits, cell.fits_devices, cell.fits_dtype = fit
    if fresh:
        cache.set_many(fresh, FIT_CACHE_SECONDS)


def _matches(model: ModelRelease, q: str) -> bool:
    q = q.lower()
    return q in model.name.lower() or q in model.slug or q in model.family.lower() or q in model.architecture.lower()


def matrix_page(request: HttpRequest) -> HttpResponse:
    actor = actor_for(request)
    filters = MatrixFilters.from_params(request.GET)
    options = PageOptions.from_params(request.GET)
    matrix = build_matrix(actor, filters)
    if options.dtype:
        replan(matrix, options.dtype)
    regressions = open_regressions(actor)
    regressed_models = {m for m, _ in regressions}
    rows = []
    for m, html in zip(matrix.models, rows_html(matrix.models, matrix.hardware, matrix.cells, regressions),
                       strict=True):
        shown = (not options.q or _matches(m, options.q)) and (not options.regressed or m.slug in regressed_models)
        rows.append({
            "model": m, "cells": mark_safe(html),  # noqa: S308 - built from escaped values in presenters
            "params": f"{human_count(m.params_total)} / {human_count(m.params_active)} active"
            if m.params_active != m.params_total else human_count(m.params_total),
            "hidden": not shown, "search": f"{m.name} {m.slug} {m.family} {m.architecture}".lower(),
            "regressed": m.slug in regressed_models,
        })
    query = urlencode({k: v for k, v in request.GET.items() if k in ("vendor", "family", "tier") and v})
    return render(request, "matrix/matrix.html", {
        "rows": rows, "shown": sum(1 for r in rows if not r["hidden"]), "hardware": matrix.hardware,
        "filters": filters, "options": options, "tiers": sorted(TIER_NAMES.items()), "vendors": vendor_choices(),
        "families": family_choices(), "dtypes": [(d, dtype_short(d)) for d in PLAN_DTYPES],
        "export_query": f"?{query}" if query else "", "open_regressions": len(regressions),
    })
