"""``GET /metrics``: the portal's Prometheus metrics, for staff sessions or ``Authorization: Bearer
<DAY0_METRICS_TOKEN>`` (Prometheus's ``authorization`` setting); anyone else is refused."""

from __future__ import annotations

import hmac

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST

from apps.ops.collectors import render


def _bearer_ok(request: HttpRequest) -> bool:
    expected = getattr(settings, "METRICS_TOKEN", "")
    given = request.headers.get("Authorization", "")
    return bool(expected) and hmac.compare_digest(given.encode(), f"Bearer {expected}".encode())


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    if not _bearer_ok(request):
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated:
            response = HttpResponse("a staff session or 'Authorization: Bearer <DAY0_METRICS_TOKEN>' is required\n",
                                    status=401, content_type="text/plain")
            response["WWW-Authenticate"] = "Bearer"
            return response
        if not user.is_staff:
            return HttpResponse("staff only\n", status=403, content_type="text/plain")
    return HttpResponse(render(), content_type=CONTENT_TYPE_LATEST)
