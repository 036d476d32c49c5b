"""The root of ``/api/v1/``: every resource, the router's viewsets and the plain views alike (the matrix, a
cell, the benchmark series and regressions), plus the schema and the docs."""

from __future__ import annotations

from typing import Any

from django.urls import NoReverseMatch, reverse
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.routers import APIRootView, DefaultRouter

# name in the root -> URL name of a plain view under /api/v1/ (resources without a viewset)
PLAIN_VIEWS: dict[str, str] = {"matrix": "matrix", "benchmarks": "benchmark-series",
                               "benchmarks/regressions": "benchmark-regressions"}
# name -> a path with placeholders (views that need arguments), relative to the site root
TEMPLATED: dict[str, str] = {"cells": "/api/v1/cells/{model}/{hardware}/", "job events": "/api/v1/jobs/{id}/events/",
                             "schema": "/api/schema/", "docs": "/api/docs/"}


class PortalAPIRootView(APIRootView):
    """Day-0 Portal API: every resource of /api/v1/. Authenticate with a session, or with
    ``Authorization: Token <secret>`` (or ``Bearer``) for an API token."""

    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        response = super().get(request, *args, **kwargs)
        data = dict(response.data)
        for name, url_name in PLAIN_VIEWS.items():
            try:
                data[name] = request.build_absolute_uri(reverse(url_name))
            except NoReverseMatch:
                continue
        for name, path in TEMPLATED.items():
            data[name] = request.build_absolute_uri("/").rstrip("/") + path
        return Response(dict(sorted(data.items())))


class PortalRouter(DefaultRouter):
    APIRootView = PortalAPIRootView
