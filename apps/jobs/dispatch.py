"""The broker side of jobs: which queue a job goes to, what its message carries, and the timing settings.

Nothing here writes a row but the weight challenge an attempt is sent (``apps.evidence.weights``): ``services.do_dispatch_job`` moves a job to dispatched and calls ``send_job``, and
``services.do_requeue_lost_jobs`` (run periodically by ``tasks.detect_lost_jobs_task``) decides which jobs are
lost. This module imports no service (services import it), so the two never form an import cycle.

The payload carries the whole job spec (model config, hardware spec, stages, dtype, overrides; its keys and types
are ``contract.jobspec``'s): agents never read the database. The task and queue names are ``contract.queues``'s."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from apps.jobs.models import Job, JobNode
from contract import jobspec
from contract.queues import RUN_JOB_TASK, agent_queue, hardware_queue
from day0portal.env import env_int


def max_attempts() -> int:
    """How many times a job is handed to an agent (first dispatch and every re-queue after a loss)."""
    return env_int("DAY0_JOB_MAX_ATTEMPTS", 3, minimum=1)


def lost_after() -> timedelta:
    """How long an agent may stay silent (or not report its job) before its job is lost."""
    return timedelta(seconds=env_int("DAY0_AGENT_LOST_SECONDS", 60, minimum=1))


def stuck_after() -> timedelta:
    """How long a dispatched job may wait unclaimed before the portal says it is stuck."""
    return timedelta(seconds=env_int("DAY0_JOB_STUCK_SECONDS", 120, minimum=1))


def task_payload(job: Job) -> dict[str, Any]:
    """What the agent needs to run ``job``, as the agent's ``run_job_task(job_id, spec)`` reads it
    (``contract.jobspec``; ``send_job`` validates it before it publishes)."""
    from apps.references.selectors import payload_for  # reads only: the challenge or the reference pool

    hw = job.hardware
    model = job.model
    return {
        **job.spec,
        "job": job.pk,
        "attempt": job.attempts,
        "nonce": job.nonce,  # this attempt's secret: every results document carries it back (job, attempt, nonce)
        "purpose": job.purpose,
        **payload_for(job),  # "challenge" (a certify attempt) or "reference_pool" (a reference job)
        "model": {"slug": model.slug, "name": model.name, "architecture": model.architecture,
                  "config": model.config, "path": job.spec.get("model_path")},
        "hardware": {"slug": hw.slug, "vendor": hw.vendor, "name": hw.name, "memory_bytes": hw.memory_bytes,
                     "memory_gb": hw.memory_bytes / 1e9, "devices_per_node": hw.devices_per_node,
                     "intra_node_gbps": hw.intra_node_gbps, "inter_node_gbps": hw.inter_node_gbps,
                     "memory_bandwidth_gbps": hw.memory_bandwidth_gbps, "dtypes": list(hw.dtypes),
                     "peak_tflops": dict(hw.peak_tflops), "operator_manifest": list(hw.operator_manifest)},
        # a reference run's weight_samples, or a certify job's weight_probe (drawn per attempt and kept secret);
        # never the release's manifest: the portal compares the load's digests itself
        **weight_challenge(job),
    }


def weight_challenge(job: Job) -> dict[str, Any]:
    from apps.evidence.weights import payload_for

    return payload_for(job)


def send_job(job: Job, nodes: Sequence[JobNode] = ()) -> None:
    """Publishes the agent task of ``job`` on ``hw.<slug>``, or, for a multi-node job, one task per reserved
    node on its agent's own queue with its node rank and the rendezvous address; raises a ``JobSpecError`` for a
    payload an agent could not read, else whatever the broker raises (the caller then releases every node: none
    runs)."""
    from apps.jobs.placement import node_payload
    from day0portal.celery import app

    payload = task_payload(job)
    if not nodes:
        queue = hardware_queue(job.hardware.slug)
        jobspec.validate(payload)
        app.send_task(RUN_JOB_TASK, args=[job.pk, payload], queue=queue, routing_key=queue)
        return
    for node in nodes:
        queue = agent_queue(node.agent_id)
        node_spec = {**payload, "node": node_payload(node, len(nodes))}
        jobspec.validate(node_spec)
        app.send_task(RUN_JOB_TASK, args=[job.pk, node_spec], queue=queue, routing_key=queue)
