"""Hands jobs to the agents and takes them back when an agent is lost.

``enqueue_job`` (called by ``services.do_create_job`` through ``transaction.on_commit``) marks a queued job
dispatched — one more attempt — and sends the agent task by name to the queue ``hw.<hardware-slug>``. The
payload carries the whole job spec (model config, hardware spec, stages, dtype, overrides): agents never read
the database.

``requeue_lost_jobs`` (run periodically by ``tasks.detect_lost_jobs_task``) declares lost the dispatched or
running jobs whose agent stopped heartbeating, or whose agent is alive but reports another job (it was killed
and restarted), and re-queues them until ``DAY0_JOB_MAX_ATTEMPTS`` attempts were made."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from apps.jobs.choices import JobState
from apps.jobs.models import Job
from day0portal.env import env_int

logger = logging.getLogger(__name__)

AGENT_TASK_NAME = "day0.run_job"  # agents/worker/app.py: TASK_NAME (the portal never imports agent code)


def max_attempts() -> int:
    return env_int("DAY0_JOB_MAX_ATTEMPTS", 3, minimum=1)


def lost_after() -> timedelta:
    """How long an agent may stay silent (or not report its job) before its job is lost."""
    return timedelta(seconds=env_int("DAY0_AGENT_LOST_SECONDS", 60, minimum=1))


def queue_for(hardware_slug: str) -> str:
    return f"hw.{hardware_slug}"


def task_payload(job: Job) -> dict[str, Any]:
    """What the agent needs to run ``job``, as the agent's ``run_job_task(job_id, spec)`` reads it."""
    hw = job.hardware
    model = job.model
    return {
        **job.spec,
        "job": job.pk,
        "attempt": job.attempts,
        "model": {"slug": model.slug, "name": model.name, "architecture": model.architecture,
                  "config": model.config, "path": job.spec.get("model_path")},
        "hardware": {"slug": hw.slug, "vendor": hw.vendor, "name": hw.name, "memory_bytes": hw.memory_bytes,
                     "memory_gb": hw.memory_bytes / 1e9, "devices_per_node": hw.devices_per_node,
                     "intra_node_gbps": hw.intra_node_gbps, "inter_node_gbps": hw.inter_node_gbps,
                     "memory_bandwidth_gbps": hw.memory_bandwidth_gbps, "dtypes": list(hw.dtypes),
                     "peak_tflops": dict(hw.peak_tflops), "operator_manifest": list(hw.operator_manifest)},
    }


def _send(job: Job) -> None:
    from day0portal.celery import app

    app.send_task(AGENT_TASK_NAME, args=[job.pk, task_payload(job)], queue=queue_for(job.hardware.slug),
                  routing_key=queue_for(job.hardware.slug))


def enqueue_job(job_id: int) -> None:
    """Send job ``job_id`` to its hardware's agents (a job no longer queued is left alone)."""
    from apps.jobs import services

    with transaction.atomic():
        job = Job.objects.select_for_update().select_related("model", "hardware").filter(pk=job_id).first()
        if job is None or job.state != JobState.QUEUED:
            return
        services.do_transition_job(job, JobState.DISPATCHED)
    try:
        _send(job)
    except Exception as exc:  # the broker is down: the job stays visible as queued, with the reason
        logger.exception("job %s: sending to %s failed", job_id, queue_for(job.hardware.slug))
        services.do_transition_job(job, JobState.QUEUED)
        Job.objects.filter(pk=job_id).update(error=f"dispatch failed, will retry: {type(exc).__name__}: {exc}")


def _lost_reason(job: Job, now: Any) -> str | None:
    agent = job.agent
    if agent is None:
        return None  # still in the broker's queue: no agent took it yet
    silent_for = now - agent.last_heartbeat_at if agent.last_heartbeat_at else None
    if silent_for is None or silent_for > lost_after():
        return f"agent {agent.hostname} stopped heartbeating"
    # dispatched_at is this attempt's; the agent reports the job in a heartbeat as soon as it takes it
    taken = job.dispatched_at
    if (job.state == JobState.RUNNING and agent.current_job_id != job.pk and taken is not None
            and now - taken > lost_after()):
        return f"agent {agent.hostname} no longer runs this job (it restarted or moved on)"
    return None


def requeue_lost_jobs() -> list[int]:
    """Marks lost and re-queues (or gives up on) jobs whose agent is gone; returns the ids declared lost."""
    from apps.jobs import services

    now = timezone.now()
    lost: list[int] = []
    candidates = Job.objects.filter(state__in=[JobState.DISPATCHED, JobState.RUNNING], agent__isnull=False)
    for job in candidates.select_related("agent", "hardware"):
        reason = _lost_reason(job, now)
        if reason is None:
            continue
        with transaction.atomic():
            locked = Job.objects.select_for_update().filter(pk=job.pk, state=job.state).first()
            if locked is None:
                continue  # it moved on meanwhile
            services.do_transition_job(locked, JobState.LOST, error=f"lost: {reason}")
            lost.append(locked.pk)
            if locked.attempts < max_attempts():
                services.do_transition_job(locked, JobState.QUEUED)
                Job.objects.filter(pk=locked.pk).update(agent=None)  # the next attempt's agent claims it
                job_id = locked.pk
                transaction.on_commit(lambda job_id=job_id: enqueue_job(job_id))
            else:
                Job.objects.filter(pk=locked.pk).update(
                    error=f"lost: {reason}; gave up after {locked.attempts} attempts (DAY0_JOB_MAX_ATTEMPTS)")
        logger.warning("job %s lost: %s", job.pk, reason)
    # jobs whose dispatch failed (broker down) are sent again
    stale = now - lost_after()
    for job_id in Job.objects.filter(state=JobState.QUEUED, updated_at__lt=stale).values_list("pk", flat=True):
        enqueue_job(job_id)
    return lost
