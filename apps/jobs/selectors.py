"""Read-side queries of jobs and their events."""

from __future__ import annotations

from django.db.models import Q, QuerySet

from apps.accounts.access import Actor
from apps.accounts.choices import Scope
from apps.catalog.selectors import visible_models_q
from apps.jobs.choices import ACTIVE_STATES
from apps.jobs.models import Job, JobEvent


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


def job_events_after(job: Job, after: int, limit: int) -> list[JobEvent]:
    """Up to ``limit`` events of ``job`` with seq > ``after``, in order."""
    return list(JobEvent.objects.filter(job=job, seq__gt=after).order_by("seq")[:limit])
