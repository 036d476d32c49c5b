"""A job's event log: an agent's batches parsed and stored idempotently on (job, seq) with one SQL statement on
PostgreSQL, the highest contiguous seq acknowledged, and the portal's own events appended after them; fresh
events are broadcast to the job's group after commit."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.utils import timezone

from apps.core import events as domain_events
from apps.core.validators import as_utc
from apps.jobs.choices import EventLevel
from apps.jobs.events import JobEventPayload, broadcast_job_events
from apps.jobs.models import Job, JobEvent
from contract.events import EVENT_MESSAGE_MAX, EVENT_NAME_MAX, KIND_CHARACTERS, event_stages

EVENT_LEVELS = frozenset(EventLevel.values)


def parse_event_batch(raw: Any, *, max_events: int) -> list[dict[str, Any]]:
    """Validates a batch ``[{seq, ts, stage, kind, level, message, data}]``; errors name the item and key.

    Hand-written rather than a DRF serializer: ingest must take ≥ 10,000 events/s."""
    if isinstance(raw, dict) and "events" in raw:
        raw = raw["events"]
    if not isinstance(raw, list):
        raise ValidationError({"events": "must be a list of events"})
    if len(raw) > max_events:
        raise ValidationError({"events": f"a batch holds at most {max_events} events, got {len(raw)}"})
    events = []
    seen: set[int] = set()
    for i, item in enumerate(raw):
        at = f"events[{i}]"
        if not isinstance(item, dict):
            raise ValidationError({at: "must be an object"})
        seq = item.get("seq")
        if isinstance(seq, bool) or not isinstance(seq, int) or not 1 <= seq < 2**62:
            raise ValidationError({f"{at}.seq": "must be an integer ≥ 1"})
        if seq in seen:
            raise ValidationError({f"{at}.seq": f"seq {seq} appears twice in the batch"})
        seen.add(seq)
        ts = item.get("ts")
        try:
            when = as_utc(datetime.fromisoformat(ts)) if isinstance(ts, str) else None
        except ValueError:  # not ISO 8601, or out of range in UTC (PostgreSQL refuses offsets beyond ±15:59)
            when = None
        if when is None:
            raise ValidationError({f"{at}.ts": "must be an ISO 8601 time"})
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        level = item.get("level") or "info"
        if level not in EVENT_LEVELS:
            raise ValidationError({f"{at}.level": f"must be one of {', '.join(sorted(EVENT_LEVELS))}"})
        kind, stage, message = item.get("kind"), item.get("stage") or "", item.get("message") or ""
        if not isinstance(kind, str) or not kind or len(kind) > EVENT_NAME_MAX or not set(kind) <= KIND_CHARACTERS:
            raise ValidationError({f"{at}.kind": f"must be a non-empty name of at most {EVENT_NAME_MAX} letters, "
                                                 "digits, '_', '-' or '.'"})
        if not isinstance(stage, str) or len(stage) > EVENT_NAME_MAX:
            raise ValidationError({f"{at}.stage": f"must be a string of at most {EVENT_NAME_MAX} characters"})
        if not isinstance(message, str):
            raise ValidationError({f"{at}.message": "must be a string"})
        if len(message) > EVENT_MESSAGE_MAX:
            raise ValidationError({f"{at}.message": f"is {len(message)} characters long; an event's message is at "
                                                    f"most {EVENT_MESSAGE_MAX}"})
        data = item.get("data")
        if data is not None and not isinstance(data, dict):
            raise ValidationError({f"{at}.data": "must be an object or null"})
        events.append({"seq": seq, "ts": when, "stage": stage, "kind": kind, "level": level, "message": message,
                       "data": data})
    return events


_PG_INSERT_EVENTS = """
INSERT INTO jobs_jobevent (job_id, seq, ts, stage, kind, level, message, data)
SELECT %s, r.seq, r.ts, r.stage, r.kind, r.level, r.message, r.data
FROM jsonb_to_recordset(%s::jsonb)
     AS r(seq bigint, ts timestamptz, stage text, kind text, level text, message text, data jsonb)
ON CONFLICT (job_id, node, seq) DO NOTHING
RETURNING seq
"""


def check_event_stages(job: Job, events: list[dict[str, Any]]) -> None:
    """Each event names a stage of ``job`` (``contract.events.event_stages``) or none: a stage the job never asked
    for cannot appear on its page as run."""
    allowed = event_stages(job.stages)
    for i, event in enumerate(events):
        if event["stage"] not in allowed:
            shown = sorted(s for s in allowed if s)
            raise ValidationError({f"events[{i}].stage": f"{event['stage']!r} is not a stage of job {job.pk} "
                                                         f"(its stages: {', '.join(shown)}; or none)"})


def _insert_events(job_id: int, events: list[dict[str, Any]]) -> set[int]:
    """Inserts node 0's events not stored yet (``node`` takes its database default, 0); returns the seqs it
    inserted.

    PostgreSQL: one statement, the batch passed as one JSON document and expanded by the server (no per-field
    work in Python). Other databases: look up the existing seqs, then ``bulk_create(ignore_conflicts=True)``;
    both are race-free because the caller holds the job row lock."""
    if connection.vendor == "postgresql":
        rows = [{**e, "ts": e["ts"].isoformat()} for e in events]
        with connection.cursor() as cursor:
            cursor.execute(_PG_INSERT_EVENTS, [job_id, json.dumps(rows)])
            return {seq for (seq,) in cursor.fetchall()}
    seqs = [e["seq"] for e in events]
    existing = set(
        JobEvent.objects.filter(job_id=job_id, node=0, seq__gte=min(seqs), seq__lte=max(seqs))
        .values_list("seq", flat=True)
    )
    fresh = [e for e in events if e["seq"] not in existing]
    JobEvent.objects.bulk_create([JobEvent(job_id=job_id, **e) for e in fresh], ignore_conflicts=True)
    return {e["seq"] for e in fresh}


@transaction.atomic
def do_store_job_events(job: Job, events: list[dict[str, Any]]) -> int:
    """Stores node 0's events idempotently on (job, seq) and returns the highest contiguous seq stored.

    The job row is locked so concurrent batches of one job serialize; events new to the database are
    broadcast to ``job.<id>`` after commit, in seq order."""
    locked = Job.objects.select_for_update().only("id", "events_acked", "events_max_seq").get(pk=job.pk)
    inserted = _insert_events(job.pk, events) if events else set()
    fresh = sorted((e for e in events if e["seq"] in inserted), key=lambda e: e["seq"])
    acked, max_seq = locked.events_acked, max(locked.events_max_seq, max(inserted, default=0))
    if fresh:
        for e in fresh:  # the usual case: the batch continues the stored prefix
            if e["seq"] != acked + 1:
                break
            acked = e["seq"]
        if max_seq > acked:  # a gap was (or still is) open: walk what is stored beyond the prefix
            stored = (JobEvent.objects.filter(job_id=job.pk, node=0, seq__gt=acked).order_by("seq")
                      .values_list("seq", flat=True))
            for seq in stored.iterator(chunk_size=2000):
                if seq != acked + 1:
                    break
                acked = seq
        Job.objects.filter(pk=job.pk).update(events_acked=acked, events_max_seq=max_seq)
    job.events_acked = acked
    if fresh:
        payloads = [JobEventPayload(seq=e["seq"], ts=e["ts"].isoformat(), stage=e["stage"], kind=e["kind"],
                                    level=e["level"], message=e["message"], data=e["data"]) for e in fresh]
        job_id = job.pk
        transaction.on_commit(lambda: broadcast_job_events(job_id, payloads))
        domain_events.publish(domain_events.job_events_stored, job_id=job_id, timestamps=[e["ts"] for e in fresh])
    return acked



def do_append_job_event(job_id: int, *, kind: str, message: str, level: str = EventLevel.INFO, stage: str = "",
                        data: dict[str, Any] | None = None) -> int:
    """Adds an event the portal itself writes (a lost attempt, a job nobody claims) after the job's highest seq,
    stored and broadcast like an agent's; returns its seq. The next agent continues after it: its spool starts
    from the job's ``events_acked``."""
    with transaction.atomic():
        locked = Job.objects.select_for_update().only("id", "events_acked", "events_max_seq").get(pk=job_id)
        seq = max(locked.events_max_seq, locked.events_acked) + 1
        do_store_job_events(locked, [{"seq": seq, "ts": timezone.now(), "stage": stage, "kind": kind, "level": level,
                                      "message": message, "data": data}])
    return seq

