"""Counters and histograms shared by every process of the portal (uvicorn workers, the Celery worker, several
hosts behind a balancer): kept in the portal's Redis (``DAY0_REDIS_URL``) as one hash per metric, incremented
atomically and read whole at scrape time. Without Redis (the embedded default: one web process) they live in
this process's memory.

Why not ``prometheus_client``'s multiprocess mode: it needs a directory shared by the processes, wiped when the
server starts, and it cannot see a Celery worker on another host; the portal already has Redis for its cache and
channel layer, and a hash increment is one round trip."""

from __future__ import annotations

import json
import logging
import threading
from collections import defaultdict
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from django.conf import settings

log = logging.getLogger(__name__)

# event ingest lag (seconds from the agent's timestamp to the portal's commit) and task durations
LAG_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)
TASK_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0)


class _Local:
    """One process's counters (no Redis)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._data: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))

    def incr(self, metric: str, fields: dict[str, float]) -> None:
        with self._lock:
            for field, amount in fields.items():
                self._data[metric][field] += amount

    def read(self, metric: str) -> dict[str, float]:
        with self._lock:
            return dict(self._data.get(metric, {}))

    def clear(self) -> None:
        with self._lock:
            self._data.clear()


class _Redis:
    def __init__(self, url: str, prefix: str) -> None:
        import redis

        self.client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
        self.prefix = prefix

    def incr(self, metric: str, fields: dict[str, float]) -> None:
        key = f"{self.prefix}:{metric}"
        with self.client.pipeline(transaction=False) as pipe:
            for field, amount in fields.items():
                pipe.hincrbyfloat(key, field, amount)
            pipe.execute()

    def read(self, metric: str) -> dict[str, float]:
        return {k.decode(): float(v) for k, v in self.client.hgetall(f"{self.prefix}:{metric}").items()}


@lru_cache(maxsize=1)
def _backend() -> _Local | _Redis:
    url = getattr(settings, "REDIS_URL", "")
    if not url:
        return _Local()
    prefix = settings.CACHES.get("default", {}).get("KEY_PREFIX", "day0")
    return _Redis(url, f"{prefix}:ops")


def _field(labels: Sequence[str]) -> str:
    return json.dumps(list(labels), separators=(",", ":"))


def inc(metric: str, labels: Sequence[str] = (), amount: float = 1.0) -> None:
    """Adds ``amount`` to the counter ``metric`` with these label values. A metric never fails the request
    that counts it: a Redis error is logged and the count is lost."""
    try:
        _backend().incr(metric, {_field(labels): amount})
    except Exception:  # noqa: BLE001 (redis.RedisError and connection errors alike)
        log.warning("could not count %s", metric, exc_info=True)


def observe(metric: str, values: Sequence[float], buckets: Sequence[float], labels: Sequence[str] = ()) -> None:
    """Observations ``values`` in the histogram ``metric`` (cumulative buckets, as Prometheus's), in one write."""
    if not values:
        return
    fields: dict[str, float] = {_field([*labels, "sum"]): float(sum(values)), _field([*labels, "count"]): len(values)}
    for bound in buckets:
        within = sum(1 for v in values if v <= bound)
        if within:
            fields[_field([*labels, f"le:{bound}"])] = within
    try:
        _backend().incr(metric, fields)
    except Exception:  # noqa: BLE001
        log.warning("could not observe %s", metric, exc_info=True)


def read_counter(metric: str) -> dict[tuple[str, ...], float]:
    """Label values -> total."""
    return {tuple(json.loads(k)): v for k, v in _backend().read(metric).items()}


def read_histogram(metric: str, buckets: Sequence[float]) -> dict[tuple[str, ...], dict[str, Any]]:
    """Label values -> ``{"buckets": [(bound, cumulative count)...], "sum", "count"}``."""
    out: dict[tuple[str, ...], dict[str, Any]] = {}
    for key, value in read_counter(metric).items():
        labels, part = key[:-1], key[-1]
        entry = out.setdefault(labels, {"le": {}, "sum": 0.0, "count": 0.0})
        if part.startswith("le:"):
            entry["le"][float(part[3:])] = value
        else:
            entry[part] = value
    for entry in out.values():
        entry["buckets"] = [(b, entry["le"].get(float(b), 0.0)) for b in buckets]
    return out
