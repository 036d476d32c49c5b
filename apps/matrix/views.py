"""The matrix page (server-rendered, works without JavaScript); the cell page is apps.dashboards'."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils.safestring import mark_safe

from agents.pipeline.tiers import TIER_NAMES
from apps.accounts.access import actor_for
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
