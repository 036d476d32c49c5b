"""Health probes: ``/healthz`` says the process is up; ``/readyz`` checks the database, the broker and
the cache/channel-layer Redis (when it is not the broker too)."""

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


def _ping_redis(url: str) -> str | None:
    import redis  # the health check's driver, loaded only where a Redis is configured

    try:
        redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2).ping()
    except Exception as exc:
        return f"redis unreachable: {exc.__class__.__name__}: {exc}"
    return None


def _check_broker() -> str | None:
    url = settings.CELERY_BROKER_URL
    if url.startswith(("amqp://", "amqps://", "pyamqp://")):
        from kombu import Connection  # an AMQP broker only: the check needs no driver otherwise

        try:
            with Connection(url, connect_timeout=2) as conn:
                conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0, timeout=2)
        except Exception as exc:
            return f"broker unreachable: {exc.__class__.__name__}: {exc}"
        return None
    if url.startswith(("redis://", "rediss://")):
        return _ping_redis(url)
    folder = Path(settings.CELERY_BROKER_TRANSPORT_OPTIONS["data_folder_in"])
    if not folder.is_dir() or not os.access(folder, os.W_OK):
        return f"broker folder {folder} is missing or not writable"
    return None


def _check_redis() -> str | None:
    """The cache and channel layer's Redis, when it is not the broker as well."""
    return _ping_redis(settings.REDIS_URL)


@never_cache
def readyz(request: HttpRequest) -> JsonResponse:
    probes = {"database": _check_database, "broker": _check_broker}
    if settings.REDIS_URL and settings.REDIS_URL != settings.CELERY_BROKER_URL:
        probes["redis"] = _check_redis
    problems = {name: msg for name, probe in probes.items() if (msg := probe())}
    checks = {name: ("fail" if name in problems else "ok") for name in probes}
    if problems:
        return JsonResponse({"status": "unavailable", "checks": checks, "errors": problems}, status=503)
    return JsonResponse({"status": "ok", "checks": checks})
