"""The writes of a multi-node job's other nodes (rank > 0): an agent claims the node it was reserved for,
reports its stage events and says how its ranks ended. Node 0 claims, reports and finishes the job itself
(``services``); its results are the job's results."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from apps.accounts.access import Actor
from apps.accounts.choices import Scope
from apps.core.validators import as_utc
from apps.jobs.choices import ACTIVE_STATES, JobState
from apps.jobs.eventlog import check_event_stages
from apps.jobs.events import JobEventPayload, broadcast_job_node_events
from apps.jobs.models import Job, JobEvent, JobNode, NodeState
from apps.jobs.services import InvalidTransition, do_transition_job

MAX_NODE_EVENTS = 2000  # per node and attempt: its stage events (a follower emits a few per ranked stage)
NODE_STATES = (NodeState.RUNNING, NodeState.FINISHED, NodeState.FAILED)


def _node_of(actor: Actor, job: Job, rank: int, attempt: int | None = None) -> JobNode:
    """The job's node ``rank`` of its current attempt, run by an agent of this token."""
    if not actor.has_scope(Scope.AGENT) or actor.hardware_id != job.hardware_id:
        raise PermissionDenied(f"only an agent token of job {job.pk}'s hardware reports its nodes")
    if attempt is not None and attempt != job.attempts:
        raise InvalidTransition(f"node {rank} reports attempt {attempt}, job {job.pk} is at attempt {job.attempts}: "
                                "a stale delivery")
    node = JobNode.objects.select_related("agent").filter(job=job, attempt=job.attempts, rank=rank).first()
    if node is None:
        raise InvalidTransition(f"job {job.pk} has no node {rank} at attempt {job.attempts} "
                                f"(it runs on {job.nodes} node(s))")
    if node.agent.token_id != actor.token.pk:
        raise PermissionDenied(f"node {rank} of job {job.pk} is reserved for agent {node.agent_id}, "
                               "registered with another token")
    return node


def _released_after_claim(node: JobNode) -> bool:
    """Node 0 finished the job (releasing every node) while this claimed node was still reporting."""
    return node.state == NodeState.RELEASED and node.claimed_at is not None


@transaction.atomic
def check_agent_node_state(actor: Actor, job: Job, rank: int, to_state: str, *, attempt: int | None = None,
                           error: str = "") -> JobNode:
    """Node ``rank`` > 0 claims its reservation (reserved → running) while the job is active, then says how its
    ranks ended (running → finished | failed, with the error; also after node 0 finished the job, which released
    the claimed node). A node that fails while the job is active fails the job, naming the node (node 0 stops
    between steps instead of waiting at a rendezvous). Anything else is a 409 naming both states."""
    if rank < 1:
        raise ValidationError({"rank": "node 0 claims and finishes the job itself (POST jobs/{id}/state/)"})
    if to_state not in NODE_STATES:
        raise ValidationError({"state": f"a node reports {', '.join(NODE_STATES)}, not {to_state!r}"})
    locked = Job.objects.select_for_update().get(pk=job.pk)
    node = _node_of(actor, locked, rank, attempt)
    if to_state == NodeState.RUNNING:
        ok = node.state == NodeState.RESERVED and locked.state in ACTIVE_STATES
    else:
        ok = node.state == NodeState.RUNNING or _released_after_claim(node)
    if not ok:
        raise InvalidTransition(f"node {rank} of job {job.pk} is {node.state} (the job is {locked.state}); "
                                f"it cannot become {to_state}")
    node.state = to_state
    if to_state == NodeState.RUNNING:
        node.claimed_at = timezone.now()
    else:
        node.finished_at = timezone.now()
        node.error = error[:10000]
    node.save(update_fields=["state", "claimed_at", "finished_at", "error"])
    if to_state == NodeState.FAILED and locked.state in ACTIVE_STATES:  # its ranks never meet: none runs on
        stage, _, detail = node.error.partition(": ")
        stage = stage if detail and stage.isidentifier() and len(stage) <= 32 else "node"
        do_transition_job(locked, JobState.FAILED, failed_stage=stage,
                          error=f"node {rank} ({node.agent.hostname}) failed: {node.error or 'no error given'}")
    return node


@transaction.atomic
def check_store_node_events(actor: Actor, job: Job, rank: int, events: list[dict[str, Any]]) -> int:
    """Node ``rank``'s events (parsed by ``eventlog.parse_event_batch``, its own seqs) kept on its row in seq
    order, idempotent on seq; answers the highest contiguous seq stored (what its spool may forget). The events
    that extend that contiguous prefix join the job's log as node ``rank``'s sequence (``append_node_stream``)."""
    locked = Job.objects.select_for_update().get(pk=job.pk)
    node = _node_of(actor, locked, rank)
    check_event_stages(locked, events)  # (after the token is known to be the node's: a 403 comes first)
    if node.state not in (NodeState.RUNNING, NodeState.FINISHED, NodeState.FAILED) and not _released_after_claim(node):
        raise InvalidTransition(f"node {rank} of job {job.pk} is {node.state}: it claims its node before it reports")
    stored = {e["seq"]: e for e in node.events}
    for e in events:
        stored.setdefault(e["seq"], {**e, "ts": e["ts"].isoformat()})
    acked = node.events_acked
    while acked + 1 in stored:
        acked += 1
    if len(stored) > MAX_NODE_EVENTS:
        raise ValidationError({"events": f"node {rank} keeps at most {MAX_NODE_EVENTS} events"})
    node.events = [stored[seq] for seq in sorted(stored)]
    newly_contiguous = [stored[seq] for seq in range(node.events_acked + 1, acked + 1)]
    node.events_acked = acked
    node.save(update_fields=["events", "events_acked"])
    append_node_stream(locked.pk, rank, newly_contiguous)
    return acked


def node_stream_seq(job_id: int, node: int) -> int:
    """The highest seq of node ``node``'s sequence in ``job_id``'s log (0: none yet)."""
    return JobEvent.objects.filter(job_id=job_id, node=node).aggregate(top=Max("seq"))["top"] or 0


def append_node_stream(job_id: int, node: int, events: list[dict[str, Any]]) -> None:
    """Adds node ``node``'s events (in its order, ``ts`` as ISO text) to the job's log after the highest seq of
    that node's sequence, and broadcasts them after commit. The caller holds the job's row lock: the portal is
    this sequence's one writer, so it stays contiguous across the node's attempts (each attempt's own seqs start
    at 1 again on its new row), and node 0's sequence, which its agent numbers, is never touched."""
    if not events:
        return
    first = node_stream_seq(job_id, node) + 1
    rows = [JobEvent(job_id=job_id, node=node, seq=first + i, ts=as_utc(datetime.fromisoformat(e["ts"])),
                     stage=e["stage"], kind=e["kind"], level=e["level"], message=e["message"], data=e["data"])
            for i, e in enumerate(events)]
    JobEvent.objects.bulk_create(rows)
    payloads = [JobEventPayload(seq=r.seq, ts=r.ts.isoformat(), stage=r.stage, kind=r.kind, level=r.level,
                                message=r.message, data=r.data) for r in rows]
    transaction.on_commit(lambda: broadcast_job_node_events(job_id, node, payloads))
