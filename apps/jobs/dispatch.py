"""Hands a queued job to the agents. Called by ``services.do_create_job`` through ``transaction.on_commit``.

For now this records nothing and returns: the job stays ``queued`` in the database. The agents engineer
replaces the body with the Celery send to the queue ``hw.<hardware-slug>`` (and the transition to
``dispatched`` through ``services.do_transition_job``)."""

from __future__ import annotations


def enqueue_job(job_id: int) -> None:
    """Send job ``job_id`` to its hardware's agents."""
    return None
