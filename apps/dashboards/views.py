"""Dashboard pages: cell evidence, live job console, benchmark trends, Day-0 timeline; exports and badges.

Every page answers 404 for a model the requester may not see (an embargoed model of another organization)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.csrf import ensure_csrf_cookie

from agents.pipeline.tiers import TIER_NAMES
from apps.accounts.access import actor_for
from apps.benchmarks.regressions import RegressionRule
from apps.benchmarks.selectors import (
    LATENCY_STATS,
    TREND_FAMILIES,
    NotVisible,
    SeriesQuery,
    SeriesQueryError,
    cells_with_benchmarks,
    load_series,
    newest_benchmarked_cell,
)
from apps.catalog.models import Hardware
from apps.catalog.selectors import model_is_public
from apps.core.csvfiles import csv_text
from apps.dashboards import charts, selectors
from apps.dashboards.badges import badge_svg
from apps.dashboards.exports import MATRIX_COLUMNS, matrix_rows
from apps.matrix.models import Cell
from apps.matrix.selectors import MatrixFilters, build_matrix


def cell_page(request: HttpRequest, model: str, hardware: str) -> HttpResponse:
    page = selectors.cell_page(actor_for(request), model, hardware)
    if page is None:
        raise Http404(f"no cell {model} × {hardware}")
    return render(request, "dashboards/cell.html", {
        "page": page, "tier_names": TIER_NAMES, "statuses": selectors.OPERATOR_STATUSES,
        "status_filter": request.GET.get("status", "") if request.GET.get("status") in selectors.OPERATOR_STATUSES
        else "",
        "layer_chart": charts.layer_chart(page), "bench_chart": charts.bench_chart(page),
    })


@ensure_csrf_cookie
def job_page(request: HttpRequest, job_id: int) -> HttpResponse:
    page = selectors.job_page(actor_for(request), job_id)
    if page is None:
        raise Http404(f"no job {job_id}")
    return render(request, "dashboards/job.html", {"page": page, "levels": ("debug", "info", "warning", "error")})


def trends_page(request: HttpRequest) -> HttpResponse:
    actor = actor_for(request)
    model, hardware = request.GET.get("model", ""), request.GET.get("hardware", "")
    if "|" in request.GET.get("cell", ""):  # the page's cell picker: "<model>|<hardware>"
        model, hardware = request.GET["cell"].split("|", 1)
    stat = request.GET.get("stat", "p50")
    if stat not in LATENCY_STATS:
        stat = "p50"
    if not model and not hardware:
        newest = newest_benchmarked_cell(actor)
        model, hardware = newest if newest else ("", "")
    error, series = "", []
    metrics = tuple(f"{f}_{stat}" if f.endswith("_ms") else f for f, _, _ in TREND_FAMILIES)
    if model and hardware:
        try:
            query = SeriesQuery.from_params({"model": model, "hardware": hardware, "since": request.GET.get("since"),
                                             "concurrency": request.GET.get("concurrency")})
            query = replace(query, metrics=metrics)
            series = load_series(actor, query, rule=RegressionRule.from_params(request.GET))
        except NotVisible as exc:
            raise Http404(str(exc)) from None
        except (SeriesQueryError, ValueError) as exc:
            error = str(exc)
    trend_charts, shared = charts.trend_charts(series, stat)
    return render(request, "dashboards/trends.html", {
        "cells": cells_with_benchmarks(actor), "model": model, "hardware": hardware, "stat": stat,
        "stats": LATENCY_STATS, "charts": trend_charts, "shared_config": shared, "regressions": charts.grouped_regressions(series),
        "flag_count": sum(len(s.regressions) for s in series),
        "error": error, "runs": len({p.ref[0] for s in series for p in s.points}),
        "since": request.GET.get("since", ""), "concurrency": request.GET.get("concurrency", ""),
    })


def day0_page(request: HttpRequest) -> HttpResponse:
    raw = request.GET.get("tier", "3")
    tier = int(raw) if raw.isdecimal() and int(raw) in selectors.DAY0_TIERS else 3
    timeline = selectors.day0_timeline(actor_for(request), rank_tier=tier)
    return render(request, "dashboards/day0.html", {
        "timeline": timeline, "leaderboard_chart": charts.leaderboard_chart(timeline),
    })


def badge(request: HttpRequest, model: str, hardware: str) -> HttpResponse:
    model_row = selectors.visible_model(actor_for(request), model)
    hardware_row = Hardware.objects.filter(slug=hardware).only("id", "slug").first()
    if model_row is None or hardware_row is None:
        raise Http404(f"no cell {model} × {hardware}")
    cell = Cell.objects.filter(model=model_row, hardware=hardware_row).only("tier", "failed_stage").first()
    svg = badge_svg(hardware_row.slug, cell.tier if cell else 0, cell.failed_stage if cell else "")
    response = HttpResponse(svg, content_type="image/svg+xml; charset=utf-8")
    # short-lived: a README shows the tier within minutes of a change; private for an embargoed model
    response["Cache-Control"] = f"max-age=300, {'public' if model_is_public(model_row) else 'private'}"
    return response


def export_matrix(request: HttpRequest, fmt: str) -> HttpResponse:
    if fmt not in ("csv", "json"):
        raise Http404(f"unknown export format {fmt!r}: use matrix.csv or matrix.json")
    rows = matrix_rows(build_matrix(actor_for(request), MatrixFilters.from_params(request.GET)))
    stamp = datetime.now(UTC).strftime("%Y%m%d")
    if fmt == "json":
        response = JsonResponse({"generated_at": datetime.now(UTC).isoformat(), "count": len(rows), "cells": rows},
                                json_dumps_params={"indent": 1})
        response["Content-Disposition"] = f'attachment; filename="day0-matrix-{stamp}.json"'
        return response
    response = HttpResponse(csv_text(rows, MATRIX_COLUMNS), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="day0-matrix-{stamp}.csv"'
    return response


