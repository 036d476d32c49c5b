"""Every write to jobs: creation, state transitions, cancellation, event ingest and result ingest."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import connection, transaction
from django.utils import timezone

from apps.accounts.access import Actor
from apps.accounts.choices import Scope
from apps.catalog.models import Hardware, ModelRelease
from apps.core.errors import ConflictError
from apps.jobs import dispatch
from apps.jobs.choices import ACTIVE_STATES, ALLOWED_TRANSITIONS, FINISHED_STATES, EventLevel, JobState
from apps.jobs.events import JobEventPayload, JobStateMessage, broadcast_job_events, broadcast_job_state
from apps.jobs.models import Job, JobEvent


class InvalidTransition(ConflictError):
    """A state change the job's state machine does not allow; the message names both states."""


# --- creation and state -------------------------------------------------------------------------------------


def check_hardware_runs_model(model: ModelRelease, hardware: Hardware) -> None:
    """Where an embargoed model may run: on hardware its own organization owns, or on a shared catalog entry
    (no owner), whose agent tokens only staff mint. Its job's queue hands the model's config to the
    hardware's agents, so any other organization's hardware is refused (``ValidationError`` on ``hardware``,
    a 400 naming both). A public or released model runs anywhere."""
    from apps.catalog.selectors import model_is_public

    if model_is_public(model) or hardware.organization_id is None or hardware.organization_id == model.organization_id:
        return
    owner = hardware.organization.slug if hardware.organization else hardware.organization_id
    raise ValidationError({"hardware": (
        f"{model.slug} is embargoed: it runs only on hardware {model.organization.slug} owns or on shared hardware "
        f"operated by staff, and {hardware.slug} belongs to {owner}")})


def check_create_job(actor: Actor, *, model: ModelRelease, hardware: Hardware, spec: dict[str, Any]) -> Job:
    """Submitters (of the model's organization for a private model) create jobs; an embargoed model only on
    hardware ``check_hardware_runs_model`` allows."""
    from apps.catalog.selectors import model_is_public

    org_id = actor.default_org_id()
    if not model_is_public(model):
        org_id = model.organization_id
    if not actor.has_scope(Scope.SUBMIT, org_id):
        raise PermissionDenied("creating a job needs the submit scope (a submitter or admin role)")
    check_hardware_runs_model(model, hardware)
    return do_create_job(model=model, hardware=hardware, spec=spec, organization_id=org_id,
                         requested_by_id=actor.user_id)


@transaction.atomic
def do_create_job(*, model: ModelRelease, hardware: Hardware, spec: dict[str, Any],
                  organization_id: int | None = None, requested_by_id: int | None = None) -> Job:
    """Stores a queued job and hands it to ``dispatch.enqueue_job`` once the transaction commits."""
    job = Job.objects.create(model=model, hardware=hardware, spec=spec, organization_id=organization_id,
                             requested_by_id=requested_by_id, state=JobState.QUEUED)
    from apps.matrix.services import recompute_cell

    recompute_cell(model.pk, hardware.pk)
    job_id = job.pk
    transaction.on_commit(lambda: dispatch.enqueue_job(job_id))
    return job


def _state_message(job: Job) -> JobStateMessage:
    return JobStateMessage(type="job.state", job=job.pk, state=job.state, attempts=job.attempts,
                           failed_stage=job.failed_stage, error=job.error)


@transaction.atomic
def do_transition_job(job: Job, to_state: str, *, failed_stage: str | None = None, error: str | None = None,
                      agent_id: int | None = None) -> Job:
    """Moves ``job`` to ``to_state`` if the state machine allows it (``choices.ALLOWED_TRANSITIONS``).

    Sets the timestamps, counts an attempt on each dispatch, stores failed stage and error, recomputes the
    cell when the job finishes and broadcasts the new state after commit. Raises ``InvalidTransition``."""
    if to_state not in JobState.values:
        raise InvalidTransition(f"unknown job state {to_state!r}; states are {', '.join(JobState.values)}")
    locked = Job.objects.select_for_update().get(pk=job.pk)
    if to_state not in ALLOWED_TRANSITIONS[locked.state]:
        raise InvalidTransition(f"job {job.pk} cannot go from {locked.state} to {to_state}")
    now = timezone.now()
    locked.state = to_state
    if agent_id is not None:
        locked.agent_id = agent_id
    if to_state == JobState.DISPATCHED:
        locked.attempts += 1
        locked.dispatched_at = now
    elif to_state == JobState.RUNNING:
        if locked.dispatched_at is None:
            locked.attempts += 1
            locked.dispatched_at = now
        locked.started_at = locked.started_at or now
    elif to_state == JobState.QUEUED:
        locked.finished_at = None
        locked.failed_stage, locked.error = "", ""
    if to_state in FINISHED_STATES:
        locked.finished_at = now
    if failed_stage is not None:
        locked.failed_stage = failed_stage[:32]
    if error is not None:
        locked.error = error
    locked.save()
    for name in ("state", "attempts", "agent_id", "dispatched_at", "started_at", "finished_at", "failed_stage",
                 "error", "updated_at"):
        setattr(job, name, getattr(locked, name))
    if to_state in FINISHED_STATES or to_state == JobState.QUEUED:
        from apps.matrix.services import recompute_cell

        recompute_cell(locked.model_id, locked.hardware_id)
    message = _state_message(locked)
    transaction.on_commit(lambda: broadcast_job_state(message))
    return job


def may_cancel_job(actor: Actor, job: Job) -> bool:
    """Whether ``actor`` may cancel ``job`` whatever its state: its requester, staff, or a submitter of the job's
    organization (a job without one is cancelled only by its requester or staff). Through a token, only one
    with the submit scope: a read token never writes."""
    if actor.user_id is None or (actor.token is not None and not actor.token.has_scope(Scope.SUBMIT)):
        return False
    in_org = job.organization_id is not None and actor.has_scope(Scope.SUBMIT, job.organization_id)
    return actor.user_id == job.requested_by_id or actor.is_staff or in_org


def can_cancel_job(actor: Actor, job: Job) -> bool:
    """Whether ``check_cancel_job`` would cancel ``job`` now (pages show the cancel button from this)."""
    return job.state in ACTIVE_STATES and may_cancel_job(actor, job)


def check_cancel_job(actor: Actor, job: Job) -> Job:
    """The requester, or a submitter of the job's organization, cancels a queued, dispatched or running job."""
    if not may_cancel_job(actor, job):
        raise PermissionDenied("cancelling this job needs the submit scope in its organization")
    if job.state not in ACTIVE_STATES:
        raise InvalidTransition(f"job {job.pk} is {job.state}; only queued, dispatched or running jobs can be cancelled")
    return do_transition_job(job, JobState.CANCELLED, error="cancelled by user")


def check_agent_for_job(actor: Actor, job: Job) -> None:
    """Agents report only on jobs of the hardware their token is bound to."""
    if not actor.has_scope(Scope.AGENT):
        raise PermissionDenied("this needs an agent token")
    if actor.hardware_id != job.hardware_id:
        raise PermissionDenied(f"the agent token is bound to another hardware than job {job.pk}'s")


# --- events -------------------------------------------------------------------------------------------------

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
            when = datetime.fromisoformat(ts) if isinstance(ts, str) else None
        except ValueError:
            when = None
        if when is None:
            raise ValidationError({f"{at}.ts": "must be an ISO 8601 time"})
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        level = item.get("level") or "info"
        if level not in EVENT_LEVELS:
            raise ValidationError({f"{at}.level": f"must be one of {', '.join(sorted(EVENT_LEVELS))}"})
        kind, stage, message = item.get("kind"), item.get("stage") or "", item.get("message") or ""
        if not isinstance(kind, str) or not kind or len(kind) > 32:
            raise ValidationError({f"{at}.kind": "must be a non-empty string of at most 32 characters"})
        if not isinstance(stage, str) or len(stage) > 32:
            raise ValidationError({f"{at}.stage": "must be a string of at most 32 characters"})
        if not isinstance(message, str):
            raise ValidationError({f"{at}.message": "must be a string"})
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
ON CONFLICT (job_id, seq) DO NOTHING
RETURNING seq
"""


def _insert_events(job_id: int, events: list[dict[str, Any]]) -> set[int]:
    """Inserts the events not stored yet; returns the seqs it inserted.

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
        JobEvent.objects.filter(job_id=job_id, seq__gte=min(seqs), seq__lte=max(seqs)).values_list("seq", flat=True)
    )
    fresh = [e for e in events if e["seq"] not in existing]
    JobEvent.objects.bulk_create([JobEvent(job_id=job_id, **e) for e in fresh], ignore_conflicts=True)
    return {e["seq"] for e in fresh}


@transaction.atomic
def do_store_job_events(job: Job, events: list[dict[str, Any]]) -> int:
    """Stores events idempotently on (job, seq) and returns the highest contiguous seq stored.

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
            stored = JobEvent.objects.filter(job_id=job.pk, seq__gt=acked).order_by("seq").values_list("seq", flat=True)
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
    return acked


# --- results ------------------------------------------------------------------------------------------------


def parse_result_document(doc: Any) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Accepts ``{"stage": s, "section": {...}}`` or a whole stage report ``{"stages": {...}, "failed_stage",
    "error", ...}``. Returns (sections by stage, report-level fields)."""
    if not isinstance(doc, dict):
        raise ValidationError({"detail": "the result document must be a JSON object"})
    if "stage" in doc:
        stage = doc.get("stage")
        if not isinstance(stage, str):
            raise ValidationError({"stage": "must be a stage name"})
        if "section" not in doc:
            raise ValidationError({"section": "is required with 'stage'"})
        return {stage: doc["section"]}, {}
    if "stages" in doc:
        stages = doc["stages"]
        if not isinstance(stages, dict) or not stages:
            raise ValidationError({"stages": "must be a non-empty object of stage sections"})
        extra = {k: doc[k] for k in ("failed_stage", "error") if doc.get(k) is not None}
        for key, value in extra.items():
            if not isinstance(value, str):
                raise ValidationError({key: "must be a string or null"})
        return dict(stages), extra
    raise ValidationError({"detail": "expected {'stage', 'section'} or a stage report with 'stages'"})


@transaction.atomic
def do_record_job_results(job: Job, doc: Any) -> list:
    """Stores a stage section or a whole report of ``job`` as evidence and recomputes its cell."""
    from apps.evidence.services import do_record_stage_results, validate_stage_names
    from apps.matrix.services import recompute_cell

    sections, extra = parse_result_document(doc)
    claimed = doc.get("hardware") if isinstance(doc, dict) and "stages" in doc else None
    if claimed is not None and claimed != job.hardware.slug:
        raise ValidationError({"hardware": f"the report is for {claimed!r}, job {job.pk} runs on {job.hardware.slug!r}"})
    validate_stage_names(job, list(sections))
    locked = Job.objects.select_for_update().get(pk=job.pk)
    if locked.state not in ACTIVE_STATES:
        raise InvalidTransition(f"job {job.pk} is {locked.state}; results are taken only while it is active")
    results = do_record_stage_results(locked, sections)
    if extra:
        Job.objects.filter(pk=job.pk).update(failed_stage=(extra.get("failed_stage") or "")[:32],
                                             error=extra.get("error") or "")
    recompute_cell(job.model_id, job.hardware_id)
    return results
