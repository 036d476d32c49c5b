"""WebSockets of jobs (the matrix's: ``apps.matrix.consumers``, on the same guarded base). Thin: authenticate, check visibility, join a group, forward.

``/ws/jobs/<id>/?after=SEQ`` replays the stored events after SEQ, then streams live ones — each event exactly
once and in seq order: the consumer joins the group *before* it reads the database, so nothing committed
during the replay is missed, and it delivers only the next contiguous seq, holding back (and, if need be,
reading from the database) anything that arrives ahead of a gap. A multi-node job's other nodes have their own
sequences (``job.node_events`` messages naming the node), replayed after ``&nodes_after=R:SEQ,…`` (every
node from its start when not given) and delivered the same way, each on its own. Both sockets accept a session or ``?token=<api token>``.

Refusals are close codes, never an HTTP 403 handshake (which a browser cannot read): the handshake is accepted
and the socket closed at once with 4400 (bad query), 4401 (bad, revoked or inactive token), 4403 (not visible)
or 4404 (no such job). A socket opened with a token closes with 4401 when the token is revoked: revocation
tells the token's sockets at once (a channel-layer group per token), and before each delivery a socket
re-checks its token at most every ``TOKEN_RECHECK_S`` seconds, so a lost broadcast or a deactivated user still
stops the stream within that bound."""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from apps.accounts.access import actor_of
from apps.accounts.authentication import find_token
from apps.accounts.events import token_group
from apps.accounts.models import ApiToken
from apps.jobs.events import job_group
from apps.jobs.models import Job, JobEvent
from apps.jobs.selectors import job_event_nodes, visible_jobs
from contract.nodes import MAX_NODES

REPLAY_PAGE = 1000
MAX_NODE_CURSORS = MAX_NODES  # nodes_after entries: one per node of a job at most
TOKEN_RECHECK_S = 5.0
CLOSE_UNAUTHENTICATED, CLOSE_FORBIDDEN, CLOSE_NOT_FOUND, CLOSE_BAD_REQUEST = 4401, 4403, 4404, 4400


def socket_query(scope: dict[str, Any]) -> dict[str, str]:
    raw = parse_qs(scope.get("query_string", b"").decode(errors="replace"))
    return {key: values[-1] for key, values in raw.items()}


@database_sync_to_async
def socket_actor(scope: dict[str, Any], token_secret: str | None) -> Any:
    """The connection's actor: an API token from ``?token=``, else the session user; None for a bad token."""

    if token_secret:
        token, _ = find_token(token_secret)
        return None if token is None else actor_of(token.user, token)
    return actor_of(scope.get("user"))


@database_sync_to_async
def _token_usable(token_id: int) -> bool:

    return ApiToken.objects.filter(pk=token_id, revoked_at__isnull=True, user__is_active=True).exists()


class GuardedConsumer(AsyncJsonWebsocketConsumer):
    """Refusal by close code, and the token watch of the module docstring."""

    token_id: int | None = None
    closed = False
    groups_joined: tuple[str, ...] = ()

    async def refuse(self, code: int) -> None:
        await self.accept()
        await self.close(code=code)
        self.closed = True

    async def join(self, actor: Any, *groups: str) -> None:

        self.token_id = actor.token.pk if actor.token is not None else None
        self.token_checked = time.monotonic()
        if self.token_id is not None:
            groups = (token_group(self.token_id), *groups)
        for group in groups:  # first join, then replay: no gap
            await self.channel_layer.group_add(group, self.channel_name)
        self.groups_joined = groups

    async def disconnect(self, code: int) -> None:
        self.closed = True
        for group in self.groups_joined:
            await self.channel_layer.group_discard(group, self.channel_name)

    async def authorized(self) -> bool:
        """Whether to deliver: False (and the socket closed with 4401) once the token is no longer usable."""
        if self.closed:
            return False
        if self.token_id is None or time.monotonic() - self.token_checked < TOKEN_RECHECK_S:
            return True
        self.token_checked = time.monotonic()
        if await _token_usable(self.token_id):
            return True
        await self.token_revoked({})
        return False

    async def token_revoked(self, message: dict[str, Any]) -> None:
        if not self.closed:
            self.closed = True
            await self.close(code=CLOSE_UNAUTHENTICATED)


@database_sync_to_async
def _job_visible(actor: Any, job_id: int) -> bool | None:
    """True if visible, False if it exists but is hidden from the actor, None if there is no such job."""

    if visible_jobs(actor).filter(pk=job_id).exists():
        return True
    return False if Job.objects.filter(pk=job_id).exists() else None


def _node_cursors(raw: str) -> dict[int, int] | None:
    """``"1:5,2:0"`` -> {node: last seq seen}; None when malformed (a node must be ≥ 1, a seq ≥ 0)."""
    cursors: dict[int, int] = {}
    items = [item for item in raw.split(",") if item.strip()]
    if len(items) > MAX_NODE_CURSORS:
        return None
    for item in items:
        node, sep, seq = item.partition(":")
        try:
            rank, after = int(node), int(seq)
        except ValueError:
            return None
        if not sep or not 1 <= rank < MAX_NODE_CURSORS or after < 0 or rank in cursors:
            return None
        cursors[rank] = after
    return cursors


@database_sync_to_async
def _event_nodes(job_id: int) -> list[int]:

    return job_event_nodes(job_id)


@database_sync_to_async
def _events_after(job_id: int, after: int, limit: int, upto: int | None = None,
                  node: int = 0) -> list[dict[str, Any]]:

    rows = JobEvent.objects.filter(job_id=job_id, node=node, seq__gt=after)
    if upto is not None:
        rows = rows.filter(seq__lt=upto)
    return [
        {"seq": e.seq, "ts": e.ts.isoformat(), "stage": e.stage, "kind": e.kind, "level": e.level,
         "message": e.message, "data": e.data}
        for e in rows.order_by("seq")[:limit]
    ]


@database_sync_to_async
def _job_state(job_id: int) -> dict[str, Any] | None:

    job = Job.objects.filter(pk=job_id).values("state", "attempts", "failed_stage", "error").first()
    return None if job is None else {"type": "job.state", "job": job_id, **job}


class JobEventsConsumer(GuardedConsumer):
    """``/ws/jobs/<id>/?after=SEQ``: the job's events (``job.events``) and state changes (``job.state``)."""

    async def connect(self) -> None:
        self.job_id = int(self.scope["url_route"]["kwargs"]["job_id"])
        query = socket_query(self.scope)
        try:
            self.last_seq = max(0, int(query.get("after") or 0))
        except ValueError:
            await self.refuse(CLOSE_BAD_REQUEST)
            return
        cursors = _node_cursors(query.get("nodes_after") or "")
        if cursors is None:
            await self.refuse(CLOSE_BAD_REQUEST)
            return
        self.node_last: dict[int, int] = cursors  # another node's last seq delivered (absent: 0)
        self.node_held: dict[int, dict[int, dict[str, Any]]] = {}
        self.held: dict[int, dict[str, Any]] = {}  # live events ahead of a gap, by seq
        actor = await socket_actor(self.scope, query.get("token"))
        if actor is None:
            await self.refuse(CLOSE_UNAUTHENTICATED)
            return
        visible = await _job_visible(actor, self.job_id)
        if not visible:
            await self.refuse(CLOSE_NOT_FOUND if visible is None else CLOSE_FORBIDDEN)
            return
        await self.join(actor, job_group(self.job_id))
        await self.accept()
        state = await _job_state(self.job_id)
        if state:
            await self.send_json(state)
        while True:
            page = await _events_after(self.job_id, self.last_seq, REPLAY_PAGE)
            if not page:
                break
            await self._deliver(page)
            if len(page) < REPLAY_PAGE:
                break
        for node in await _event_nodes(self.job_id):
            while True:
                page = await _events_after(self.job_id, self.node_last.get(node, 0), REPLAY_PAGE, node=node)
                if not page:
                    break
                await self._deliver_node(node, page)
                if len(page) < REPLAY_PAGE:
                    break

    async def _deliver(self, events: list[dict[str, Any]]) -> None:
        """Sends the next contiguous events after ``last_seq``; older ones are dropped, later ones held."""
        for event in events:
            if event["seq"] > self.last_seq:
                self.held[event["seq"]] = event
        batch = []
        while self.last_seq + 1 in self.held:
            self.last_seq += 1
            batch.append(self.held.pop(self.last_seq))
        if batch:
            await self.send_json({"type": "job.events", "job": self.job_id, "events": batch})

    async def job_events(self, message: dict[str, Any]) -> None:
        if not await self.authorized():
            return
        await self._deliver(message["events"])
        if self.held:  # a gap: the missing events may be stored already (a lost broadcast)
            await self._deliver(await _events_after(self.job_id, self.last_seq, REPLAY_PAGE, upto=min(self.held)))

    async def _deliver_node(self, node: int, events: list[dict[str, Any]]) -> None:
        """``_deliver`` for node ``node``'s own sequence."""
        last, held = self.node_last.get(node, 0), self.node_held.setdefault(node, {})
        for event in events:
            if event["seq"] > last:
                held[event["seq"]] = event
        batch = []
        while last + 1 in held:
            last += 1
            batch.append(held.pop(last))
        self.node_last[node] = last
        if batch:
            await self.send_json({"type": "job.node_events", "job": self.job_id, "node": node, "node_events": batch})

    async def job_node_events(self, message: dict[str, Any]) -> None:
        if not await self.authorized():
            return
        node = int(message["node"])
        await self._deliver_node(node, message["node_events"])
        held = self.node_held.get(node)
        if held:  # a gap (a lost broadcast): read what is stored up to the first held seq
            await self._deliver_node(node, await _events_after(self.job_id, self.node_last.get(node, 0),
                                                               REPLAY_PAGE, upto=min(held), node=node))

    async def job_state(self, message: dict[str, Any]) -> None:
        if await self.authorized():
            await self.send_json(message)
