"""Every write to jobs: creation, dispatch, state transitions (the agents' claims and finishes included),
cancellation, event ingest and lost-job recovery (result ingest: ``apps.jobs.results``)."""

from __future__ import annotations

import json
import logging
import secrets
from datetime import UTC, datetime
from typing import Any

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from apps.accounts.access import Actor
from apps.accounts.choices import Scope
from apps.catalog.models import Hardware, ModelRelease
from apps.core.errors import ConflictError
from apps.core.validators import as_utc
from apps.fleet.models import Agent
from apps.jobs import dispatch, placement
from apps.jobs.choices import (
    ACTIVE_STATES,
    ALLOWED_TRANSITIONS,
    FINISHED_STATES,
    EventLevel,
    JobPurpose,
    JobState,
)
from apps.jobs.events import JobEventPayload, JobStateMessage, broadcast_job_events, broadcast_job_state
from apps.jobs.models import ACTIVE_NODE_STATES, Job, JobEvent, JobNode, NodeState
from apps.ops.counters import events_stored
from contract.queues import hardware_queue

logger = logging.getLogger(__name__)


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


def check_may_queue_on_hardware(actor: Actor, hardware: Hardware) -> None:
    """Who queues jobs on a hardware: a shared catalog entry (no owner) takes jobs from everyone who may submit;
    an organization's hardware only from its own members with the submit scope there (a token of that
    organization), and from staff sessions. ``PermissionDenied`` (403) naming the hardware and its owner."""
    owner_id = hardware.organization_id
    if owner_id is None or (actor.is_staff and actor.token is None) or actor.has_scope(Scope.SUBMIT, owner_id):
        return
    owner = hardware.organization.slug if hardware.organization else owner_id
    raise PermissionDenied(f"hardware {hardware.slug} belongs to {owner}: only its members (submitters or admins, "
                           f"with a session or a {owner} token) queue jobs on it")


def check_create_job(actor: Actor, *, model: ModelRelease, hardware: Hardware, spec: dict[str, Any]) -> Job:
    """Submitters (of the model's organization for a private model) create jobs; an embargoed model only on
    hardware ``check_hardware_runs_model`` allows."""
    from apps.catalog.selectors import model_is_public

    org_id = actor.default_org_id()
    if not model_is_public(model):
        org_id = model.organization_id
    if not actor.has_scope(Scope.SUBMIT, org_id):
        raise PermissionDenied("creating a job needs the submit scope (a submitter or admin role)")
    check_hardware_runs_model(model, hardware)  # the embargo's 400 first: it names the model's rule
    check_may_queue_on_hardware(actor, hardware)
    return do_create_job(model=model, hardware=hardware, spec=spec, organization_id=org_id,
                         requested_by_id=actor.user_id)


@transaction.atomic
def do_create_job(*, model: ModelRelease, hardware: Hardware, spec: dict[str, Any],
                  organization_id: int | None = None, requested_by_id: int | None = None,
                  purpose: str = JobPurpose.CERTIFY) -> Job:
    """Stores a queued job and hands it to ``do_dispatch_job`` once the transaction commits. ``nodes``: the
    hosts its plan spans (``placement.plan_nodes``), one agent each."""
    job = Job.objects.create(model=model, hardware=hardware, spec=spec, organization_id=organization_id,
                             requested_by_id=requested_by_id, state=JobState.QUEUED, purpose=purpose,
                             nodes=placement.plan_nodes(model, hardware, spec))
    from apps.matrix.services import recompute_cell

    recompute_cell(model.pk, hardware.pk)
    job_id = job.pk
    transaction.on_commit(lambda: do_dispatch_job(job_id))
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
        locked.nonce = secrets.token_hex(16)
        locked.dispatched_at = now
    elif to_state == JobState.RUNNING:
        if locked.dispatched_at is None:
            locked.attempts += 1
            locked.nonce = secrets.token_hex(16)
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
    for name in ("state", "attempts", "nonce", "agent_id", "dispatched_at", "started_at", "finished_at",
                 "failed_stage", "error", "updated_at"):
        setattr(job, name, getattr(locked, name))
    if to_state in FINISHED_STATES or to_state == JobState.QUEUED:
        placement.release_nodes(locked.pk)  # its agents are free for the next job (or the next attempt)
        from apps.matrix.services import recompute_cell

        recompute_cell(locked.model_id, locked.hardware_id, reason=f"job {locked.pk} {to_state}"
                       + (f" at {locked.failed_stage}" if locked.failed_stage else ""))
    message = _state_message(locked)
    transaction.on_commit(lambda: broadcast_job_state(message))
    if to_state in (JobState.FAILED, JobState.LOST):
        from apps.alerts.services import do_alert_job_failed

        do_alert_job_failed(locked)  # subscribers hear of the failure (issue 13)
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


def check_agent_for_job(actor: Actor, job: Job, *, reporting: bool = False) -> None:
    """Agents act only on jobs of the hardware their token is bound to, and once an agent claimed a job, only
    through that agent's token: another agent of the same hardware cannot write into its log or evidence.
    ``reporting`` (events, results): a queued or dispatched job is claimed first (409), so no agent reports on a
    job before it is its own."""
    if not actor.has_scope(Scope.AGENT):
        raise PermissionDenied("this needs an agent token")
    if actor.hardware_id != job.hardware_id:
        raise PermissionDenied(f"the agent token is bound to another hardware than job {job.pk}'s")
    if reporting and job.state in (JobState.QUEUED, JobState.DISPATCHED):
        raise InvalidTransition(f"job {job.pk} is {job.state}: an agent claims it (state running) before it "
                                "reports events or results")
    if job.agent_id is not None:
        owner_token = Agent.objects.filter(pk=job.agent_id).values_list("token_id", flat=True).first()
        if owner_token != actor.token.pk:
            raise PermissionDenied(f"job {job.pk} is run by agent {job.agent_id}, registered with another token")


AGENT_STATES = (JobState.RUNNING, JobState.SUCCEEDED, JobState.FAILED)


def _agent_of_token(actor: Actor, agent_id: int | None) -> Agent | None:
    if agent_id is None:
        return None
    agent = Agent.objects.filter(pk=agent_id).first()
    if agent is None or agent.token_id != actor.token.pk:
        raise PermissionDenied(f"agent {agent_id} is not registered with this token")
    return agent


def check_agent_transition_job(actor: Actor, job: Job, to_state: str, *, agent_id: int | None = None,
                               attempt: int | None = None, failed_stage: str | None = None,
                               error: str | None = None) -> Job:
    """An agent claims a dispatched job (dispatched → running, naming its agent id, which must be registered
    with its token, and optionally the attempt its delivery carries) and finishes the job it claimed (running →
    succeeded | failed). Every other move is the portal's: queued, dispatched and lost are refused with a 400,
    a claim of a job that is not dispatched (or of a stale attempt) or a finish of one that is not running is a
    409, and a finish from another agent than the claimant is a 403."""
    check_agent_for_job(actor, job)
    if to_state not in AGENT_STATES:
        raise ValidationError({"state": f"an agent reports only {', '.join(AGENT_STATES)}, not {to_state!r}"})
    agent = _agent_of_token(actor, agent_id)
    with transaction.atomic():
        locked = Job.objects.select_for_update().get(pk=job.pk)
        check_agent_for_job(actor, locked)  # again on the locked row: it may have been lost and re-queued meanwhile
        if to_state == JobState.RUNNING:
            if locked.state != JobState.DISPATCHED:
                raise InvalidTransition(f"job {job.pk} is {locked.state}; an agent claims only a dispatched job")
            if agent is None:
                raise ValidationError({"agent": "a claim names the agent that runs the job (its id from registering)"})
            if attempt is not None and attempt != locked.attempts:
                raise InvalidTransition(f"the claim is for attempt {attempt}, job {job.pk} is at attempt "
                                        f"{locked.attempts}: a stale delivery")
            if locked.nodes > 1:  # a multi-node job is claimed by the agent reserved as its node 0
                claimed = JobNode.objects.filter(job=locked, attempt=locked.attempts, rank=0, agent=agent,
                                                 state=NodeState.RESERVED).update(state=NodeState.RUNNING,
                                                                                  claimed_at=timezone.now())
                if not claimed:
                    raise InvalidTransition(f"job {job.pk} runs on {locked.nodes} nodes: agent {agent.pk} is not "
                                            f"its node 0 for attempt {locked.attempts}")
            else:  # an agent reserved for a multi-node job runs that one next: it leaves this job to another
                held = JobNode.objects.filter(agent=agent, state__in=ACTIVE_NODE_STATES).first()
                if held is not None:
                    raise InvalidTransition(f"agent {agent.pk} is reserved for node {held.rank} of job "
                                            f"{held.job_id}; job {job.pk} is left to another agent")
        else:
            if locked.state != JobState.RUNNING:
                raise InvalidTransition(f"job {job.pk} is {locked.state}; an agent finishes only a running job")
            if agent is not None and locked.agent_id is not None and agent.pk != locked.agent_id:
                raise PermissionDenied(f"job {job.pk} is run by agent {locked.agent_id}, not {agent.pk}")
            if to_state == JobState.SUCCEEDED:
                from apps.jobs.results import stages_without_result

                missing = stages_without_result(locked)
                if missing:  # a job succeeds only when every stage it asked for has a verdict
                    to_state, failed_stage = JobState.FAILED, missing[0]
                    error = f"no result for stages: {', '.join(missing)}"
        do_transition_job(locked, to_state, failed_stage=failed_stage, error=error,
                          agent_id=agent.pk if to_state == JobState.RUNNING else None)
    for name in ("state", "attempts", "agent_id", "dispatched_at", "started_at", "finished_at", "failed_stage",
                 "error", "updated_at"):
        setattr(job, name, getattr(locked, name))
    return job


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
ON CONFLICT (job_id, node, seq) DO NOTHING
RETURNING seq
"""


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
        events_stored(job, [e["ts"] for e in fresh])
    return acked


# --- dispatch, portal events and lost jobs -------------------------------------------------------------------


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


def do_dispatch_job(job_id: int) -> None:
    """Sends queued job ``job_id`` to its hardware's agents as one more attempt (a job no longer queued is left
    alone). A job that used up ``DAY0_JOB_MAX_ATTEMPTS`` fails instead, naming the cap. When the broker refuses
    the message, the job goes back to queued with the reason and the attempt is not counted (no agent got it);
    ``do_requeue_lost_jobs`` sends it again later."""
    cap = dispatch.max_attempts()
    with transaction.atomic():
        job = Job.objects.select_for_update().select_related("model", "hardware").filter(pk=job_id).first()
        if job is None or job.state != JobState.QUEUED:
            return
        if job.attempts >= cap:
            do_transition_job(job, JobState.FAILED, error=f"gave up after {job.attempts} attempts "
                                                           f"(DAY0_JOB_MAX_ATTEMPTS={cap})")
            return
        nodes: list[JobNode] = []
        if job.nodes > 1:  # all of its agents at once, or none
            nodes, waiting = placement.reserve_nodes(job, job.attempts + 1)
            if waiting is not None:
                _note_waiting(job, waiting)
                return
        do_transition_job(job, JobState.DISPATCHED)
        from apps.references.services import draw_challenge

        draw_challenge(job)  # this attempt's secret challenge (a certify job running align or eval)
    try:
        if nodes:
            dispatch.send_job(job, nodes)
        else:
            dispatch.send_job(job)
    except Exception as exc:  # the broker is down: the job stays visible as queued, with the reason
        logger.exception("job %s: sending to %s failed", job_id, hardware_queue(job.hardware.slug))
        with transaction.atomic():
            locked = Job.objects.select_for_update().filter(pk=job_id, state=JobState.DISPATCHED,
                                                            attempts=job.attempts, agent__isnull=True).first()
            if locked is None:
                return  # an agent claimed it meanwhile (the broker did take it) or it was cancelled
            do_transition_job(locked, JobState.QUEUED)  # releases its reserved nodes: none runs
            Job.objects.filter(pk=job_id).update(
                attempts=F("attempts") - 1, dispatched_at=None,
                error=f"dispatch failed, will retry: {type(exc).__name__}: {exc}")


def _note_waiting(job: Job, reason: str) -> None:
    """A multi-node job stays queued until enough agents are free: the reason is its error (the API and page
    show it) and, when it changes, an event; ``do_requeue_lost_jobs`` tries the dispatch again later."""
    if job.error == reason:
        Job.objects.filter(pk=job.pk).update(updated_at=timezone.now())
        return
    Job.objects.filter(pk=job.pk).update(error=reason, updated_at=timezone.now())
    job.error = reason
    do_append_job_event(job.pk, kind="waiting", level=EventLevel.WARNING, message=reason,
                        data={"nodes": job.nodes, "attempt": job.attempts + 1})


def _lost_reason(job: Job, now: datetime) -> str | None:
    agent = job.agent
    if agent is None:
        return None  # still in the broker's queue: no agent took it yet (see selectors.job_waiting_reason)
    if job.nodes > 1:  # every node's agent must stay alive: a rank on a silent host blocks all the others
        for node in JobNode.objects.filter(job=job, attempt=job.attempts, rank__gt=0,
                                           state__in=ACTIVE_NODE_STATES).select_related("agent"):
            beat = node.agent.last_heartbeat_at
            if beat is None or now - beat > dispatch.lost_after():
                return f"agent {node.agent.hostname} (node {node.rank}) stopped heartbeating"
    silent_for = now - agent.last_heartbeat_at if agent.last_heartbeat_at else None
    if silent_for is None or silent_for > dispatch.lost_after():
        return f"agent {agent.hostname} stopped heartbeating"
    # dispatched_at is this attempt's; the agent reports the job in a heartbeat as soon as it takes it
    taken = job.dispatched_at
    if (job.state == JobState.RUNNING and agent.current_job_id != job.pk and taken is not None
            and now - taken > dispatch.lost_after()):
        return f"agent {agent.hostname} no longer runs this job (it restarted or moved on)"
    return None


def _declare_lost(job: Job, reason: str, cap: int) -> bool:
    """Marks ``job`` lost and re-queues it while attempts remain; keeps the reason as an event. False when the
    job moved on meanwhile."""
    with transaction.atomic():
        locked = Job.objects.select_for_update().filter(pk=job.pk, state=job.state).first()
        if locked is None:
            return False
        attempt = locked.attempts
        do_transition_job(locked, JobState.LOST, error=f"lost: {reason}")
        if attempt < cap:
            do_transition_job(locked, JobState.QUEUED)
            Job.objects.filter(pk=locked.pk).update(agent=None)  # the next attempt's agent claims it
            outcome = f"re-queued for attempt {attempt + 1} of {cap}"
            transaction.on_commit(lambda: do_dispatch_job(locked.pk))
        else:
            outcome = f"gave up after {attempt} attempts (DAY0_JOB_MAX_ATTEMPTS={cap})"
            Job.objects.filter(pk=locked.pk).update(error=f"lost: {reason}; {outcome}")
        do_append_job_event(locked.pk, kind="lost", level=EventLevel.WARNING,
                            message=f"attempt {attempt} lost: {reason}; {outcome}",
                            data={"attempt": attempt, "reason": reason, "requeued": attempt < cap})
    logger.warning("job %s lost: %s; %s", job.pk, reason, outcome)
    return True


def _notice_stuck(now: datetime) -> None:
    """Writes, once per attempt, an event on each dispatched job nobody claimed within ``DAY0_JOB_STUCK_SECONDS``
    saying why (``selectors.job_waiting_reason``): the job's console and ``day0 jobs watch`` show it."""
    from apps.jobs.selectors import job_waiting_reason

    waiting = Job.objects.filter(state=JobState.DISPATCHED, agent__isnull=True,
                                 dispatched_at__lt=now - dispatch.stuck_after()).select_related("hardware")
    for job in waiting[:500]:
        if JobEvent.objects.filter(job=job, kind="stuck", data__attempt=job.attempts).exists():
            continue
        reason = job_waiting_reason(job, now=now)
        if reason:
            do_append_job_event(job.pk, kind="stuck", level=EventLevel.WARNING, message=reason,
                                data={"attempt": job.attempts, "since": job.dispatched_at.isoformat()})


def do_requeue_lost_jobs() -> list[int]:
    """Marks lost and re-queues (or gives up on) jobs whose agent is gone, keeping the reason as an event; sends
    again the queued jobs whose dispatch failed; notes the dispatched jobs nobody claims. Returns the ids declared
    lost."""
    now = timezone.now()
    cap = dispatch.max_attempts()
    lost: list[int] = []
    candidates = Job.objects.filter(state__in=[JobState.DISPATCHED, JobState.RUNNING], agent__isnull=False)
    for job in candidates.select_related("agent", "hardware"):
        reason = _lost_reason(job, now)
        if reason is not None and _declare_lost(job, reason, cap):
            lost.append(job.pk)
    stale = now - dispatch.lost_after()
    for job_id in Job.objects.filter(state=JobState.QUEUED, updated_at__lt=stale).values_list("pk", flat=True):
        do_dispatch_job(job_id)
    _notice_stuck(now)
    return lost
