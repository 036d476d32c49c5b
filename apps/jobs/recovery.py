"""Lost-job recovery, run periodically (``tasks.detect_lost_jobs_task``): jobs whose agent (or one of its
nodes' agents) stopped heartbeating are declared lost and re-queued while attempts remain; queued jobs whose
dispatch failed are sent again; dispatched jobs nobody claims get an event saying why."""

from __future__ import annotations

import logging
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from apps.jobs import dispatch
from apps.jobs.choices import EventLevel, JobState
from apps.jobs.eventlog import do_append_job_event
from apps.jobs.models import ACTIVE_NODE_STATES, Job, JobEvent, JobNode
from apps.jobs.selectors import job_waiting_reason
from apps.jobs.services import do_dispatch_job, do_transition_job

logger = logging.getLogger(__name__)


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
