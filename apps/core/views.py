"""Health probes: ``/healthz`` says the process is up; ``/readyz`` checks the database and the broker."""

from __future__ import annotations

import os
from pathlib import Path

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache


@never_cache
def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


def _check_database() -> str | None:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except Exception as exc:  # any driver error means "not ready"
        return f"database unreachable: {exc.__class__.__name__}: {exc}"
    return None


def _check_broker() -> str | None:
    if settings.REDIS_URL:
        import redis

        try:
            client = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=2, socket_timeout=2)
            client.ping()
        except Exception as exc:
            return f"redis unreachable: {exc.__class__.__name__}: {exc}"
        return None
    folder = Path(settings.CELERY_BROKER_TRANSPORT_OPTIONS["data_folder_in"])
    if not folder.is_dir() or not os.access(folder, os.W_OK):
        return f"broker folder {folder} is missing or not writable"
    return None


@never_cache
def readyz(request: HttpRequest) -> JsonResponse:
    problems = {name: msg for name, msg in (("database", _check_database()), ("broker", _check_broker())) if msg}
    checks = {name: ("fail" if name in problems else "ok") for name in ("database", "broker")}
    if problems:
        return JsonResponse({"status": "unavailable", "checks": checks, "errors": problems}, status=503)
    return JsonResponse({"status": "ok", "checks": checks})
