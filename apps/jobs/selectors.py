"""Read-side queries of jobs and their events."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db.models import Count, Max, Q, QuerySet
from django.utils import timezone

from apps.accounts.access import Actor
from apps.accounts.choices import Scope
from apps.catalog.selectors import visible_models_q
from apps.jobs.choices import ACTIVE_STATES, ONLINE_WINDOW, JobPurpose, JobState
from apps.jobs.dispatch import stuck_after
from apps.jobs.models import Job, JobEvent
from contract.engines import DEFAULT_ENGINE


def visible_jobs(actor: Actor) -> QuerySet[Job]:
    """Jobs whose model the actor may see (a job on a private model is its organization's only): the one rule of
    the job list, detail, events, results, state (an agent's claim), heartbeats and WebSockets.

    An agent token sees the embargoed jobs its organization may see, like any token of it: the agents of an
    organization's own hardware run its embargoed models, and ``services.check_hardware_runs_model`` sends no
    other organization's embargoed model there. The token of a shared catalog entry minted by staff
    (``Actor.operates_shared_hardware``) also sees the jobs of its hardware it may be handed (queued,
    dispatched, running: its queue carries them, whatever the model's organization) and those its agents ran;
    not the finished history of other organizations' embargoed models."""
    q = visible_models_q(actor, prefix="model__")
    if actor.has_scope(Scope.AGENT) and actor.operates_shared_hardware:
        q |= Q(hardware_id=actor.hardware_id) & (Q(state__in=ACTIVE_STATES) | Q(agent__token_id=actor.token.pk))
    return Job.objects.filter(q).select_related(
        "model", "hardware", "organization", "requested_by"
    )


def job_events_after(job: Job, after: int, limit: int, node: int = 0) -> list[JobEvent]:
    """Up to ``limit`` events of ``job``'s node ``node`` (0: the job's own sequence) with seq > ``after``, in
    order."""
    return list(JobEvent.objects.filter(job=job, node=node, seq__gt=after).order_by("seq")[:limit])


def job_event_nodes(job_id: int) -> list[int]:
    """The nodes other than 0 that have events in ``job_id``'s log, in rank order."""
    return sorted(set(JobEvent.objects.filter(job_id=job_id, node__gt=0).values_list("node", flat=True)
                      .distinct()))


def engine_label(spec: dict) -> str:
    """The engine a job spec runs, ``NAME@VERSION`` (``day0``: the bundled runtime, a spec naming none)."""
    engine = spec.get("engine") or {}
    name, version = engine.get("name") or DEFAULT_ENGINE, engine.get("version") or ""
    return f"{name}@{version}" if version else name


def job_waiting_reason(job: Job, *, now: datetime | None = None) -> str | None:
    """Why a dispatched job has not been claimed, once it waited ``DAY0_JOB_STUCK_SECONDS``: no agent of its
    hardware online (and when one was last seen), or agents online that did not take it. None otherwise."""
    if job.state == JobState.QUEUED and job.error.startswith("waiting for "):
        return job.error  # placement: fewer agents free than the plan has nodes, or none online has its engine
    if job.state != JobState.DISPATCHED or job.dispatched_at is None or job.agent_id is not None:
        return None
    now = now or timezone.now()
    waited = now - job.dispatched_at
    if waited < stuck_after():
        return None
    since = f"dispatched {_duration(waited)} ago ({job.dispatched_at:%Y-%m-%d %H:%M} UTC) and not claimed"
    slug = job.hardware.slug
    beats = job.hardware.agents.aggregate(
        last=Max("last_heartbeat_at"), online=Count("pk", filter=Q(last_heartbeat_at__gte=now - ONLINE_WINDOW)))
    if beats["online"]:
        # counts only: the running jobs may be another organization's; a reference run is the portal's own
        busy = Job.objects.filter(hardware_id=job.hardware_id, state=JobState.RUNNING).aggregate(
            running=Count("pk"), reference=Count("pk", filter=Q(purpose=JobPurpose.REFERENCE)))
        if busy["running"]:
            of_them = (f", {busy['reference']} of them a release's reference run"
                       if busy["reference"] else "")
            return (f"{since}: {beats['online']} agent(s) of {slug} online, but none took it from queue hw.{slug}: "
                    f"{busy['running']} job(s) running on {slug}{of_them}; it waits its turn")
        return (f"{since}: {beats['online']} agent(s) of {slug} online, but none took it from queue hw.{slug} "
                "(busy with other jobs, or consuming another queue)")
    if beats["last"] is None:
        return f"{since}: no agent of {slug} is online; none has ever registered (start one with day0 agent)"
    return f"{since}: no agent of {slug} is online; the last heartbeat was {_duration(now - beats['last'])} ago"


def _duration(delta: timedelta) -> str:
    seconds = max(int(delta.total_seconds()), 0)
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"
