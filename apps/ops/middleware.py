"""Counts refused result posts by reason, from the answer the API gives (no hook inside the jobs app)."""

from __future__ import annotations

import re
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

from apps.ops.counters import refusal_reason, result_refused

RESULTS_PATH = re.compile(r"^/api/v1/jobs/[^/]+/results/?$")


class RefusedResultsMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if 400 <= response.status_code < 500 and request.method == "POST" and RESULTS_PATH.match(request.path):
            result_refused(refusal_reason(response.status_code, getattr(response, "data", None)),
                           response.status_code)
        return response
