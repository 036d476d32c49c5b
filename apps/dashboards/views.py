"""Dashboard pages: cell evidence (and its "Run adaptation" form), live job console, the jobs list, model,
hardware and fleet pages, regressions and the comparison of two runs, benchmark trends, Day-0 timeline; exports
and badges.

Every page answers 404 for a model the requester may not see (an embargoed model of another organization)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.csrf import ensure_csrf_cookie
from django.views.decorators.http import require_POST

from apps.accounts.access import actor_for
from apps.accounts.models import Organization
from apps.benchmarks.open_regressions import (
    HEADLINE_METRICS,
    PAGE_ROWS,
    group_rows,
    newest_flagged_cell,
    open_regressions,
    regression_rows,
)
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
from apps.catalog.selectors import model_is_public, visible_models
from apps.core.csvfiles import csv_text
from apps.dashboards import charts, selectors
from apps.dashboards.badges import badge_svg
from apps.dashboards.exports import MATRIX_COLUMNS, matrix_rows
from apps.dashboards.forms import BENCH_FIELDS, THRESHOLD_PRESETS, RunForm, may_submit, threshold_help
from apps.dashboards.selectors import catalog as catalog_pages
from apps.dashboards.selectors.compare import compare_engines, compare_jobs
from apps.dashboards.selectors.day0 import cell_marks
from apps.dashboards.selectors.fleet import fleet, online_agent_count
from apps.dashboards.selectors.jobs import STATES, JobFilters, job_list, previous_job_ids
from apps.evidence.manifests import digest_disagreement
from apps.fleet.stacks import series_stack_changes
from apps.jobs.api.serializers import JobCreateSerializer
from apps.jobs.selectors import job_waiting_reason
from apps.jobs.services import check_create_job
from apps.matrix.history import cell_history
from apps.matrix.models import Cell
from apps.matrix.selectors import MatrixFilters, build_matrix
from contract.tiers import STAGE_ORDER, TIER_NAMES


def cell_page(request: HttpRequest, model: str, hardware: str, *, form: RunForm | None = None,
              status: int = 200) -> HttpResponse:
    actor = actor_for(request)
    engine = request.GET.get("engine", "").strip()[:140]
    page = selectors.cell_page(actor, model, hardware, jobs_page=request.GET.get("jobs", 1), engine_ref=engine)
    if page is None:
        raise Http404(f"no cell {model} × {hardware}" + (f" with engine {engine}" if engine else ""))
    can_submit = may_submit(actor, page.model)
    if can_submit and form is None:
        form = RunForm.initial(page.model, page.hardware)
    portal = request.build_absolute_uri("/").rstrip("/")
    return render(request, "dashboards/cell.html", {
        "page": page, "tier_names": TIER_NAMES, "statuses": selectors.OPERATOR_STATUSES,
        "status_filter": request.GET.get("status", "") if request.GET.get("status") in selectors.OPERATOR_STATUSES
        else "",
        "layer_chart": charts.layer_chart(page), "bench_chart": charts.bench_chart(page),
        "regressions": open_regressions(actor, model=page.model.slug, hardware=page.hardware.slug).get(
            (page.model.slug, page.hardware.slug), []),
        "can_submit": can_submit, "form": form if can_submit else None,
        "history": cell_history(page.cell, limit=20) if page.cell is not None and page.cell.pk else [],
        "cli": form.cli(portal) if can_submit else "", "curl": form.curl(portal) if can_submit else "",
        "stage_choices": STAGE_ORDER, "presets": THRESHOLD_PRESETS, "bench_fields": BENCH_FIELDS,
        "threshold_help": threshold_help(), "online_agents": online_agent_count(page.hardware.pk),
        "digest_conflict": digest_disagreement(page.model),
    }, status=status)


@require_POST
def run_adaptation(request: HttpRequest, model: str, hardware: str) -> HttpResponse:
    """The cell's "Run adaptation" form: validated by the API's serializer, created by the API's service; a
    bad field re-renders the form (400) with the error next to it and the values as typed."""
    actor = actor_for(request)
    model_row = selectors.visible_model(actor, model)
    hardware_row = Hardware.objects.select_related("organization").filter(slug=hardware).first()
    if model_row is None or hardware_row is None:
        raise Http404(f"no cell {model} × {hardware}")
    if not may_submit(actor, model_row):
        raise PermissionDenied("running an adaptation needs the submit role in the model's organization")
    form = RunForm.from_post(model_row, hardware_row, request.POST)
    payload = form.payload()
    serializer = JobCreateSerializer(data=payload)
    if serializer.is_valid() and not form.errors:
        try:  # the API's own creation check: the spec on this model and hardware, then who may create
            job = check_create_job(actor, model=model_row, hardware=hardware_row, spec=serializer.spec())
        except ValidationError as exc:
            form.errors.update({k: " ".join(v) for k, v in exc.message_dict.items()})
        else:
            return redirect(f"/jobs/{job.pk}/")
    for key, messages in (serializer.errors or {}).items():
        form.errors[key] = _error_text(messages)
    return cell_page(request, model, hardware, form=form, status=400)


def _error_text(messages: Any) -> str:
    """A serializer's error (a list, or a dict of nested field errors) as one sentence."""
    if isinstance(messages, dict):
        return "; ".join(f"{k}: {_error_text(v)}" for k, v in messages.items())
    if isinstance(messages, list):
        return " ".join(_error_text(m) for m in messages)
    return str(messages)


@ensure_csrf_cookie
def job_page(request: HttpRequest, job_id: int) -> HttpResponse:
    page = selectors.job_page(actor_for(request), job_id)
    if page is None:
        raise Http404(f"no job {job_id}")
    return render(request, "dashboards/job.html", {"page": page, "levels": ("debug", "info", "warning", "error"),
                                                   "waiting_reason": job_waiting_reason(page.job)})


def jobs_page(request: HttpRequest) -> HttpResponse:
    actor = actor_for(request)
    filters = JobFilters.from_params(request.GET)
    jobs = job_list(actor, filters, request.GET.get("page", 1))
    previous = previous_job_ids(list(jobs.object_list))
    for job in jobs.object_list:
        job.previous_id = previous.get(job.pk)
    return render(request, "dashboards/jobs.html", {
        "jobs": jobs, "filters": filters, "states": STATES, "query": filters.query(),
        "models": visible_models(actor).order_by("slug").values_list("slug", "name"),
        "hardware": Hardware.objects.order_by("slug").values_list("slug", "name"),
        "organizations": Organization.objects.order_by("slug").values_list("slug", "name"),
    })


def model_page(request: HttpRequest, slug: str) -> HttpResponse:
    page = catalog_pages.model_page(actor_for(request), slug)
    if page is None:
        raise Http404(f"no model {slug}")
    return render(request, "dashboards/model.html", {"page": page, "tiers": selectors.TIMELINE_TIERS})


def hardware_list(request: HttpRequest) -> HttpResponse:
    return render(request, "dashboards/hardware_list.html", {"rows": catalog_pages.hardware_list()})


def hardware_page(request: HttpRequest, slug: str) -> HttpResponse:
    page = catalog_pages.hardware_page(actor_for(request), slug)
    if page is None:
        raise Http404(f"no hardware {slug}")
    return render(request, "dashboards/hardware.html", {"page": page})


def agents_page(request: HttpRequest) -> HttpResponse:
    return render(request, "dashboards/agents.html", {"agents": fleet(actor_for(request))})


def regressions_page(request: HttpRequest) -> HttpResponse:
    """Flagged runs across every series, newest first, each linked to the comparison of the two runs."""
    actor = actor_for(request)
    params = {k: request.GET.get(k, "").strip()[:100] for k in ("model", "hardware", "metric", "since")}
    open_only = request.GET.get("open") in ("1", "on", "true")
    error, rows = "", []
    try:
        query = SeriesQuery.from_params({k: v for k, v in params.items() if v})
        rows = regression_rows(actor, query, RegressionRule.from_params(request.GET), open_only=open_only)
    except NotVisible as exc:
        error = str(exc)
    except (SeriesQueryError, ValueError) as exc:
        error = str(exc)
    groups = group_rows(rows)
    page = Paginator(groups, PAGE_ROWS).get_page(request.GET.get("page", 1))
    query = urlencode({**{k: v for k, v in params.items() if v}, **({"open": "1"} if open_only else {})})
    return render(request, "dashboards/regressions.html", {
        "page": page, "count": len(groups), "open_count": sum(1 for g in groups if g.is_open), "params": params,
        "open_only": open_only, "error": error, "query": query, "metrics": HEADLINE_METRICS,
        "cells": cells_with_benchmarks(actor),
    })


def compare_page(request: HttpRequest) -> HttpResponse:
    """``/compare/?a=JOB&b=JOB``: two runs side by side; ``/compare/?model=M&hardware=H&a=ENGINE&b=ENGINE``: two
    engines (or two versions, ``NAME@VERSION``) of one model × hardware, each by its newest run there."""
    raw_a, raw_b = request.GET.get("a", "").strip()[:140], request.GET.get("b", "").strip()[:140]
    model, hardware = request.GET.get("model", "").strip(), request.GET.get("hardware", "").strip()
    if model or hardware:
        found = compare_engines(actor_for(request), model, hardware, raw_a, raw_b) if raw_a and raw_b else (
            "a and b name the two engines to compare (NAME or NAME@VERSION)")
        if found is None:
            raise Http404(f"no cell {model} × {hardware}")
        if isinstance(found, str):
            return render(request, "dashboards/compare.html", {
                "comparison": None, "a": raw_a, "b": raw_b, "model": model, "hardware": hardware,
                "error": found}, status=400)
        return render(request, "dashboards/compare.html", {"comparison": found, "a": raw_a, "b": raw_b,
                                                           "model": model, "hardware": hardware})
    if not raw_a and not raw_b:
        return render(request, "dashboards/compare.html", {"comparison": None, "error": ""})
    if not (raw_a.isdecimal() and raw_b.isdecimal()):
        return render(request, "dashboards/compare.html", {
            "comparison": None, "a": raw_a, "b": raw_b,
            "error": f"a and b must be job ids (integers), got a={raw_a!r} and b={raw_b!r}"}, status=400)
    comparison = compare_jobs(actor_for(request), int(raw_a), int(raw_b))
    if comparison is None:
        raise Http404(f"no job {raw_a} or {raw_b}")
    return render(request, "dashboards/compare.html", {"comparison": comparison, "a": raw_a, "b": raw_b})


def trends_page(request: HttpRequest) -> HttpResponse:
    actor = actor_for(request)
    model, hardware = request.GET.get("model", ""), request.GET.get("hardware", "")
    if "|" in request.GET.get("cell", ""):  # the page's cell picker: "<model>|<hardware>"
        model, hardware = request.GET["cell"].split("|", 1)
    stat = request.GET.get("stat", "p50")
    if stat not in LATENCY_STATS:
        stat = "p50"
    if not model and not hardware:  # open on what changed most recently: the newest flagged run's cell
        newest = newest_flagged_cell(actor) or newest_benchmarked_cell(actor)
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
    trend_charts, shared = charts.trend_charts(series, stat, series_stack_changes(series))
    return render(request, "dashboards/trends.html", {
        "cells": cells_with_benchmarks(actor), "model": model, "hardware": hardware, "stat": stat,
        "stats": LATENCY_STATS, "charts": [c for c in trend_charts if not c["absent"]],
        "absent_charts": [c["title"] for c in trend_charts if c["absent"]], "shared_config": shared, "regressions": charts.grouped_regressions(series),
        "flag_count": sum(len(s.regressions) for s in series),
        "error": error, "runs": len({p.ref[0] for s in series for p in s.points}),
        "since": request.GET.get("since", ""), "concurrency": request.GET.get("concurrency", ""),
    })


def day0_page(request: HttpRequest) -> HttpResponse:
    raw = request.GET.get("tier", "3")
    tier = int(raw) if raw.isdecimal() and int(raw) in selectors.TIMELINE_TIERS else 3
    include_hosts = request.GET.get("hosts") in ("1", "on", "true")
    timeline = selectors.day0_timeline(actor_for(request), rank_tier=tier, include_hosts=include_hosts)
    return render(request, "dashboards/day0.html", {
        "timeline": timeline, "leaderboard_chart": charts.leaderboard_chart(timeline), "include_hosts": include_hosts,
    })


def badge(request: HttpRequest, model: str, hardware: str) -> HttpResponse:
    model_row = selectors.visible_model(actor_for(request), model)
    hardware_row = Hardware.objects.filter(slug=hardware).only("id", "slug").first()
    if model_row is None or hardware_row is None:
        raise Http404(f"no cell {model} × {hardware}")
    cell = (Cell.objects.filter(model=model_row, hardware=hardware_row, engine__default=True)  # the bundled runtime's
            .only("tier", "failed_stage", "custom_thresholds", "synthetic", "disputed").first())
    marks = cell_marks(cell.custom_thresholds, cell.synthetic, cell.disputed) if cell else ()
    svg = badge_svg(hardware_row.slug, cell.tier if cell else 0, cell.failed_stage if cell else "", marks)
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


