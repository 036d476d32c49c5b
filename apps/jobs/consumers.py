"""WebSockets of jobs and of the matrix. Thin: authenticate, check visibility, join a group, forward.

``/ws/jobs/<id>/?after=SEQ`` replays the stored events after SEQ, then streams live ones — each event exactly
once and in seq order: the consumer joins the group *before* it reads the database, so nothing committed
during the replay is missed, and it delivers only the next contiguous seq, holding back (and, if need be,
reading from the database) anything that arrives ahead of a gap. ``/ws/matrix/`` forwards cell changes of the
models the client may see. Both accept a session or ``?token=<api token>``; refusals close with 4401
(not signed in where needed), 4403 (not visible) or 4404 (no such job)."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from apps.jobs.events import job_group

REPLAY_PAGE = 1000
CLOSE_UNAUTHENTICATED, CLOSE_FORBIDDEN, CLOSE_NOT_FOUND, CLOSE_BAD_REQUEST = 4401, 4403, 4404, 4400


def _query(scope: dict[str, Any]) -> dict[str, str]:
    raw = parse_qs(scope.get("query_string", b"").decode(errors="replace"))
    return {key: values[-1] for key, values in raw.items()}


@database_sync_to_async
def _actor(scope: dict[str, Any], token_secret: str | None) -> Any:
    """The connection's actor: an API token from ``?token=``, else the session user; None for a bad token."""
    from apps.accounts.access import actor_of
    from apps.accounts.authentication import find_token

    if token_secret:
        token, _ = find_token(token_secret)
        return None if token is None else actor_of(token.user, token)
    return actor_of(scope.get("user"))


@database_sync_to_async
def _job_visible(actor: Any, job_id: int) -> bool | None:
    """True if visible, False if it exists but is hidden from the actor, None if there is no such job."""
    from apps.jobs.models import Job
    from apps.jobs.selectors import visible_jobs

    if visible_jobs(actor).filter(pk=job_id).exists():
        return True
    return False if Job.objects.filter(pk=job_id).exists() else None


@database_sync_to_async
def _events_after(job_id: int, after: int, limit: int, upto: int | None = None) -> list[dict[str, Any]]:
    from apps.jobs.models import JobEvent

    rows = JobEvent.objects.filter(job_id=job_id, seq__gt=after)
    if upto is not None:
        rows = rows.filter(seq__lt=upto)
    return [
        {"seq": e.seq, "ts": e.ts.isoformat(), "stage": e.stage, "kind": e.kind, "level": e.level,
         "message": e.message, "data": e.data}
        for e in rows.order_by("seq")[:limit]
    ]


@database_sync_to_async
def _job_state(job_id: int) -> dict[str, Any] | None:
    from apps.jobs.models import Job

    job = Job.objects.filter(pk=job_id).values("state", "attempts", "failed_stage", "error").first()
    return None if job is None else {"type": "job.state", "job": job_id, **job}


class JobEventsConsumer(AsyncJsonWebsocketConsumer):
    """``/ws/jobs/<id>/?after=SEQ``: the job's events (``job.events``) and state changes (``job.state``)."""

    async def connect(self) -> None:
        self.job_id = int(self.scope["url_route"]["kwargs"]["job_id"])
        query = _query(self.scope)
        try:
            self.last_seq = max(0, int(query.get("after") or 0))
        except ValueError:
            await self.close(code=CLOSE_BAD_REQUEST)
            return
        self.held: dict[int, dict[str, Any]] = {}  # live events ahead of a gap, by seq
        actor = await _actor(self.scope, query.get("token"))
        if actor is None:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        visible = await _job_visible(actor, self.job_id)
        if not visible:
            await self.close(code=CLOSE_NOT_FOUND if visible is None else CLOSE_FORBIDDEN)
            return
        self.group = job_group(self.job_id)
        await self.channel_layer.group_add(self.group, self.channel_name)  # first join, then replay: no gap
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

    async def disconnect(self, code: int) -> None:
        if getattr(self, "group", None):
            await self.channel_layer.group_discard(self.group, self.channel_name)

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
        await self._deliver(message["events"])
        if self.held:  # a gap: the missing events may be stored already (a lost broadcast)
            await self._deliver(await _events_after(self.job_id, self.last_seq, REPLAY_PAGE, upto=min(self.held)))

    async def job_state(self, message: dict[str, Any]) -> None:
        await self.send_json(message)


class MatrixConsumer(AsyncJsonWebsocketConsumer):
    """``/ws/matrix/``: ``cell.changed`` and ``matrix.changed`` messages about models the client may see."""

    async def connect(self) -> None:
        from apps.matrix.events import MATRIX_GROUP

        self.actor = await _actor(self.scope, _query(self.scope).get("token"))
        if self.actor is None:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.group = MATRIX_GROUP
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if getattr(self, "group", None):
            await self.channel_layer.group_discard(self.group, self.channel_name)

    @database_sync_to_async
    def _visible(self, *, slug: str | None = None, model_id: int | None = None) -> bool:
        from apps.catalog.selectors import visible_models

        if slug is None and model_id is None:
            return True
        qs = visible_models(self.actor)
        return qs.filter(slug=slug).exists() if slug is not None else qs.filter(pk=model_id).exists()

    async def cell_changed(self, message: dict[str, Any]) -> None:
        if await self._visible(slug=message.get("model")):
            await self.send_json(message)

    async def matrix_changed(self, message: dict[str, Any]) -> None:
        if await self._visible(model_id=message.get("model_id")):
            await self.send_json(message)
