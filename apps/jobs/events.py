"""Channels messages about jobs, sent to the group ``job.<id>`` (consumed by ``/ws/jobs/<id>/``).

Producers broadcast only through ``broadcast_job_events``, ``broadcast_job_node_events`` and
``broadcast_job_state``, after the rows they
describe are committed: the portal persists every event before it broadcasts it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, TypedDict

from apps.core.broadcast import group_send


def job_group(job_id: int) -> str:
    return f"job.{job_id}"


class JobEventPayload(TypedDict):
    seq: int
    ts: str
    stage: str
    kind: str
    level: str
    message: str
    data: dict[str, Any] | None


class JobEventsMessage(TypedDict):
    """Newly stored events of one job, in seq order (a consumer handles it in ``job_events``)."""

    type: Literal["job.events"]
    job: int
    events: list[JobEventPayload]


class JobNodeEventsMessage(TypedDict):
    """Newly stored events of node ``node`` (> 0) of a multi-node job, in that node's seq order (a consumer
    handles it in ``job_node_events``). Their seqs are the node's own sequence, apart from the job's: the list
    is ``node_events``, not ``events``, so a client that knows only ``job.events`` leaves it alone."""

    type: Literal["job.node_events"]
    job: int
    node: int
    node_events: list[JobEventPayload]


class JobStateMessage(TypedDict):
    """A job changed state (a consumer handles it in ``job_state``)."""

    type: Literal["job.state"]
    job: int
    state: str
    attempts: int
    failed_stage: str
    error: str


def _send(group: str, message: JobEventsMessage | JobNodeEventsMessage | JobStateMessage) -> None:
    group_send(group, dict(message))


def broadcast_job_events(job_id: int, events: Sequence[JobEventPayload]) -> None:
    """Sends stored events of ``job_id`` to ``job.<id>`` as one ``job.events`` message."""
    if events:
        _send(job_group(job_id), JobEventsMessage(type="job.events", job=job_id, events=list(events)))


def broadcast_job_node_events(job_id: int, node: int, events: Sequence[JobEventPayload]) -> None:
    """Sends stored events of node ``node`` of ``job_id`` to ``job.<id>`` as one ``job.node_events`` message."""
    if events:
        _send(job_group(job_id), JobNodeEventsMessage(type="job.node_events", job=job_id, node=node,
                                                      node_events=list(events)))


def broadcast_job_state(message: JobStateMessage) -> None:
    _send(job_group(message["job"]), message)
