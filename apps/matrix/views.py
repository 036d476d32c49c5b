"""The matrix page (server-rendered, works without JavaScript; static/js/matrix_filters.js applies the search
and filters as they change). The cell page is apps.dashboards'."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from django.core.cache import cache
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.template.loader import render_to_string
from django.utils.safestring import mark_safe

from apps.accounts.access import Actor, actor_for
from apps.benchmarks.open_regressions import open_regressions
from apps.catalog.models import Hardware, ModelRelease
from apps.matrix import grid_cache
from apps.matrix.presenters import dtype_short, human_count, rows_html
from apps.matrix.selectors import (
    Matrix,
    MatrixFilters,
    build_matrix_page,
    engine_choices,
    family_choices,
    vendor_choices,
)
from apps.matrix.services import estimate_fit
from contract.planner.memory import DTYPES
from contract.tiers import TIER_NAMES

PLAN_DTYPES = tuple(DTYPES)  # the formats the planner knows
FIT_CACHE_SECONDS = 3600
PAGE_SIZE = 20  # rows of the first paint: 20 × 40 hardware stays under 500 KB of HTML
PAGE_SIZE_MIN, PAGE_SIZE_MAX = 5, 200


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


def page_params(params: object) -> tuple[int, int]:
    """``?page=`` (from 1) and ``?page_size=`` (``PAGE_SIZE_MIN``–``PAGE_SIZE_MAX``, default ``PAGE_SIZE``); a bad
    value is the default."""
    get = params.get  # type: ignore[attr-defined]
    def number(raw: str | None, default: int) -> int:
        raw = (raw or "").strip()
        return int(raw) if raw.isdecimal() and len(raw) < 7 else default
    return max(1, number(get("page"), 1)), min(PAGE_SIZE_MAX, max(PAGE_SIZE_MIN, number(get("page_size"), PAGE_SIZE)))


def _grid(actor: Actor, filters: MatrixFilters, options: PageOptions, number: int, size: int,
          regressions: dict[tuple[str, str], list[str]], params: dict[str, str]) -> dict[str, Any]:
    """The rendered grid of one page (table, pager, counts) and the filter choices: what the cache keeps."""
    regressed_models = {m for m, _ in regressions}
    keep = None
    if options.q or options.regressed:
        def keep(m: ModelRelease) -> bool:
            return (not options.q or _matches(m, options.q)) and (not options.regressed or m.slug in regressed_models)
    page = build_matrix_page(actor, filters, number, size, keep)
    matrix = page.matrix
    if options.dtype:
        replan(matrix, options.dtype)
    rows = []
    for m, html in zip(matrix.models, rows_html(matrix.models, matrix.hardware, matrix.cells, regressions),
                       strict=True):
        rows.append({
            "model": m, "cells": mark_safe(html),  # noqa: S308 - built from escaped values in presenters
            "params": f"{human_count(m.params_total)} / {human_count(m.params_active)} active"
            if m.params_active != m.params_total else human_count(m.params_total),
            "search": f"{m.name} {m.slug} {m.family} {m.architecture}".lower(),
            "regressed": m.slug in regressed_models,
        })
    def link(n: int) -> str:
        return "?" + urlencode({**params, "page": n} if n > 1 else params)
    count = (f"{page.shown} of {page.total} model{'s' if page.total != 1 else ''} × {len(matrix.hardware)} "
             "hardware")
    html = render_to_string("matrix/_grid.html", {
        "rows": rows, "hardware": matrix.hardware, "page": page, "count": count,
        "prev": link(page.number - 1) if page.number > 1 else "",
        "next": link(page.number + 1) if page.number < page.pages else "",
        "first": link(1), "last": link(page.pages),
    }).strip()
    return {"html": html, "count": count, "vendors": vendor_choices(), "families": family_choices(),
            "engines": engine_choices()}


def matrix_page(request: HttpRequest) -> HttpResponse:
    """The page: the form, then one page of rows (``?page=``, ``?page_size=``); search, regressed-only and the
    filters narrow the rows before they are paged. The grid is cached per viewer scope, filters and page
    (``grid_cache``); ``?fragment=grid`` answers the grid alone (the search as you type fetches it)."""
    actor = actor_for(request)
    filters = MatrixFilters.from_params(request.GET)
    options = PageOptions.from_params(request.GET)
    number, size = page_params(request.GET)
    regressions = open_regressions(actor)
    params = {k: v for k, v in (("q", options.q), ("vendor", filters.vendor), ("family", filters.family),
                                ("engine", filters.engine),
                                ("tier", "" if filters.min_tier is None else str(filters.min_tier)),
                                ("dtype", options.dtype), ("regressed", "1" if options.regressed else ""),
                                ("page_size", "" if size == PAGE_SIZE else str(size))) if v}
    flags = sorted([m, h, sorted(metrics)] for (m, h), metrics in regressions.items())
    grid = grid_cache.cached("page", actor, [params, number, flags],
                             lambda: _grid(actor, filters, options, number, size, regressions, params))
    if request.GET.get("fragment") == "grid":
        return HttpResponse(grid["html"])
    query = urlencode({k: v for k, v in request.GET.items() if k in ("vendor", "family", "tier", "engine") and v})
    return render(request, "matrix/matrix.html", {
        "grid": mark_safe(grid["html"]), "count": grid["count"],  # noqa: S308 - rendered by the template engine
        "filters": filters, "options": options, "tiers": sorted(TIER_NAMES.items()), "vendors": grid["vendors"],
        "families": grid["families"], "engines": grid.get("engines") or [], "dtypes": [(d, dtype_short(d)) for d in PLAN_DTYPES],
        "export_query": f"?{query}" if query else "", "open_regressions": len(regressions),
    })
