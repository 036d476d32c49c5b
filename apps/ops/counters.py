"""The one-line hooks other apps call (and the receivers below call) to count what happens: each adds to the
shared counters of ``apps.ops.store`` after the transaction commits, so a rolled-back write counts nothing."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from apps.ops import store


def events_stored(hardware: str, timestamps: Sequence[datetime]) -> None:
    """Agent events of a job on ``hardware`` just committed, with the agent's timestamp of each (the lag is
    measured now: the receiver runs after the commit)."""
    if not timestamps:
        return
    now = timezone.now()
    store.inc("events_ingested", [hardware], len(timestamps))
    store.observe("event_ingest_lag_seconds", [max((now - ts).total_seconds(), 0.0) for ts in timestamps],
                  store.LAG_BUCKETS, [hardware])


def result_refused(reason: str, status: int) -> None:
    store.inc("results_refused", [reason, str(status)])


def tier_changed(hardware: str, before: int, after: int) -> None:
    transaction.on_commit(lambda: store.inc("tier_changes", [hardware, "up" if after > before else "down"]))


def task_finished(task: str, outcome: str, seconds: float | None) -> None:
    store.inc("celery_tasks", [task, outcome])
    if seconds is not None:
        store.observe("celery_task_seconds", [seconds], store.TASK_BUCKETS, [task])


def websocket_delta(route: str, delta: int) -> None:
    store.inc("websocket_connections", [route], delta)
    if delta > 0:
        store.inc("websocket_opened", [route])


def refusal_reason(status: int, data: Any) -> str:
    """A short, bounded reason for a refused results post, from the API's error answer: the field a 400 names,
    what a 409 conflicts with, or the status's meaning."""
    detail = data.get("detail") if isinstance(data, dict) else None
    text = str(detail or "").lower()
    if status == 400 and isinstance(data, dict) and data:
        field = next(iter(data))
        return f"invalid_{field}" if field in _KNOWN_FIELDS else "invalid_document"  # "detail": the document
    if status == 409:
        for needle, reason in _CONFLICTS:
            if needle in text:
                return reason
        return "conflict"
    return {401: "unauthenticated", 403: "forbidden", 404: "no_such_job", 413: "too_large"}.get(status, "other")


_KNOWN_FIELDS = frozenset({"attempt", "nonce", "hardware", "stage", "section", "stages"})
_CONFLICTS = (
    ("superseded attempt", "superseded_attempt"),
    ("nonce does not match", "wrong_nonce"),
    ("already has a result", "replay"),
    ("results are taken only while it is active", "job_not_active"),
)
