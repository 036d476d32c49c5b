"""``/ws/matrix/``: the matrix's cell changes, forwarded to a client (a session or ``?token=``) for the models it
may see; thin, on the jobs sockets' guarded base (``apps.jobs.consumers``: authentication, close codes, token
re-checks)."""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async

from apps.catalog.selectors import visible_models
from apps.jobs.consumers import CLOSE_UNAUTHENTICATED, GuardedConsumer, socket_actor, socket_query
from apps.matrix.events import MATRIX_GROUP


class MatrixConsumer(GuardedConsumer):
    """``/ws/matrix/``: ``cell.changed`` and ``matrix.changed`` messages about models the client may see."""

    async def connect(self) -> None:
        self.actor = await socket_actor(self.scope, socket_query(self.scope).get("token"))
        if self.actor is None:
            await self.refuse(CLOSE_UNAUTHENTICATED)
            return
        await self.join(self.actor, MATRIX_GROUP)
        await self.accept()

    @database_sync_to_async
    def _visible(self, *, slug: str | None = None, model_id: int | None = None) -> bool:
        if slug is None and model_id is None:
            return True
        qs = visible_models(self.actor)
        return qs.filter(slug=slug).exists() if slug is not None else qs.filter(pk=model_id).exists()

    async def cell_changed(self, message: dict[str, Any]) -> None:
        if await self.authorized() and await self._visible(slug=message.get("model")):
            await self.send_json(message)

    async def matrix_changed(self, message: dict[str, Any]) -> None:
        if await self.authorized() and await self._visible(model_id=message.get("model_id")):
            await self.send_json(message)
