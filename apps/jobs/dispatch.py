"""The broker side of jobs: which queue a job goes to, what its message carries, and the timing settings.

``services.do_dispatch_job`` moves a job to dispatched and calls ``send_job``; ``recovery.do_requeue_lost_jobs``
(run periodically by ``tasks.detect_lost_jobs_task``) decides which jobs are lost. This module imports no service
(services import it), so the two never form an import cycle.

The payload carries the whole job spec (model config, hardware spec, stages, dtype, overrides; its keys and types
are ``contract.jobspec``'s, and ``send_job`` validates it before it publishes): agents never read the database. The
task and queue names are ``contract.queues``'s. Apps above jobs add their parts of it (``add_payload_part``, from their ``AppConfig.ready``): the
references app an attempt's challenge or a reference run's pool, evidence the weight challenge (the one row a
payload writes: the digests an attempt is asked for)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from apps.jobs.models import Job, JobNode
from apps.jobs.placement import node_payload
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


PayloadPart = Callable[[Job], dict[str, Any]]
_PAYLOAD_PARTS: list[PayloadPart] = []


def add_payload_part(part: PayloadPart) -> None:
    """Adds ``part(job)``'s keys to every task payload (an app above jobs, from its ``AppConfig.ready``)."""
    if part not in _PAYLOAD_PARTS:
        _PAYLOAD_PARTS.append(part)


def task_payload(job: Job) -> dict[str, Any]:
    """What the agent needs to run ``job``, as the agent's ``run_job_task(job_id, spec)`` reads it: the job, its
    model and hardware, and the parts other apps add (``add_payload_part``)."""
    hw = job.hardware
    model = job.model
    payload = {
        **job.spec,
        "job": job.pk,
        "attempt": job.attempts,
        "nonce": job.nonce,  # this attempt's secret: every results document carries it back (job, attempt, nonce)
        "purpose": job.purpose,
        "model": {"slug": model.slug, "name": model.name, "architecture": model.architecture,
                  "config": model.config, "path": job.spec.get("model_path")},
        "hardware": {"slug": hw.slug, "vendor": hw.vendor, "name": hw.name, "memory_bytes": hw.memory_bytes,
                     "memory_gb": hw.memory_bytes / 1e9, "devices_per_node": hw.devices_per_node,
                     "intra_node_gbps": hw.intra_node_gbps, "inter_node_gbps": hw.inter_node_gbps,
                     "memory_bandwidth_gbps": hw.memory_bandwidth_gbps, "dtypes": list(hw.dtypes),
                     "peak_tflops": dict(hw.peak_tflops), "operator_manifest": list(hw.operator_manifest)},
    }
    for part in _PAYLOAD_PARTS:
        payload.update(part(job))
    return payload


def send_job(job: Job, nodes: Sequence[JobNode] = ()) -> None:
    """Publishes the agent task of ``job`` on ``hw.<slug>``, or, for a multi-node job, one task per reserved
    node on its agent's own queue with its node rank and the rendezvous address; raises a ``JobSpecError`` for a
    payload an agent could not read, else whatever the broker raises (the caller then releases every node: none
    runs)."""
    from day0portal.celery import app  # the Celery app autodiscovers the apps' tasks: loaded when sending

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
