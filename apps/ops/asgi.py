"""Open WebSocket connections by route, counted around the Channels router (accepted, then closed)."""

from __future__ import annotations

import re
from typing import Any

from apps.ops.counters import websocket_delta

_ROUTES = ((re.compile(r"^/ws/jobs/[^/]+/?$"), "jobs"), (re.compile(r"^/ws/matrix/?$"), "matrix"))


def _route(path: str) -> str:
    return next((name for pattern, name in _ROUTES if pattern.match(path)), "other")


class CountConnections:
    """ASGI middleware for the ``websocket`` protocol: +1 when the consumer accepts, -1 when the socket ends."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> Any:
        from asgiref.sync import sync_to_async

        route = _route(scope.get("path", ""))
        accepted = False

        async def counting_send(message: dict) -> None:
            nonlocal accepted
            if message.get("type") == "websocket.accept" and not accepted:
                accepted = True
                await sync_to_async(websocket_delta, thread_sensitive=False)(route, 1)
            await send(message)

        try:
            return await self.app(scope, receive, counting_send)
        finally:
            if accepted:
                await sync_to_async(websocket_delta, thread_sensitive=False)(route, -1)
