"""The broker names the portal publishes to and the agents consume: one Celery task, a queue per hardware kind
and a queue per agent.

The portal (``apps.jobs.dispatch``) sends ``RUN_JOB_TASK`` with ``(job_id, spec)`` (``contract.jobspec``) to
``hardware_queue(slug)``, or, for a node of a multi-node job, to that node's ``agent_queue(agent_id)``; an agent
(``agents.worker``) consumes exactly ``agent_queues(slug, agent_id)``, and on RabbitMQ its broker user may read
those two and nothing else (``day0portal.rabbitmq``)."""

from __future__ import annotations

RUN_JOB_TASK = "day0.run_job"  # the agent's one task: run_job_task(job_id, spec)
HARDWARE_PREFIX = "hw."
AGENT_PREFIX = "agent."
AGENT_DEFAULT_QUEUE = HARDWARE_PREFIX + "default"  # the agent app's default (it consumes only its named queues)


def hardware_queue(hardware_slug: str) -> str:
    """The queue every agent of one hardware kind consumes: a job for that hardware goes there."""
    return f"{HARDWARE_PREFIX}{hardware_slug}"


def agent_queue(agent_id: int) -> str:
    """The queue only agent ``agent_id`` consumes (beside its hardware's): a multi-node job's node goes there."""
    return f"{AGENT_PREFIX}{agent_id}"


def agent_queues(hardware_slug: str, agent_id: int) -> tuple[str, str]:
    """Every queue agent ``agent_id`` of ``hardware_slug`` consumes, and may read on RabbitMQ."""
    return hardware_queue(hardware_slug), agent_queue(agent_id)
