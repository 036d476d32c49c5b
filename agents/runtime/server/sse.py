"""Server-sent events that notice a client leaving: the request's generator is closed (aborting it in the
engine) as soon as the connection drops, streaming or not."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from agents.runtime.engine import RequestOutput
from agents.runtime.server.async_engine import RequestGroup

log = logging.getLogger(__name__)


async def _wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class SSEResponse(Response):
    """Streams ``events`` (already formatted SSE strings); ``source`` is the engine generator to close."""

    def __init__(self, events: AsyncIterator[str], source: RequestGroup) -> None:
        super().__init__(status_code=200, media_type="text/event-stream")
        self.events = events
        self.source = source

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})

        async def pump() -> None:
            async for event in self.events:
                await send({"type": "http.response.body", "body": event.encode(), "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        tasks = [asyncio.create_task(pump()), asyncio.create_task(_wait_disconnect(receive))]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                try:
                    await task
                except (asyncio.CancelledError, OSError):  # the client left mid-stream
                    pass
                except Exception:
                    log.exception("streaming a response failed")
            with contextlib.suppress(Exception):
                await self.events.aclose()  # type: ignore[attr-defined]
            self.source.close()


async def collect_unless_disconnected(
    request: Request, stream: RequestGroup
) -> list[tuple[int, RequestOutput]] | None:
    """All outputs of a non-streamed request, or None when the client left first (the request is aborted)."""

    async def collect() -> list[tuple[int, RequestOutput]]:
        try:
            return [out async for out in stream]
        finally:
            stream.close()

    work = asyncio.create_task(collect())
    watch = asyncio.create_task(_wait_disconnect(request.receive))
    try:
        await asyncio.wait([work, watch], return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not work.done():
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await work
            stream.close()
    return work.result() if not work.cancelled() else None
