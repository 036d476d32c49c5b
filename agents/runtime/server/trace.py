"""ASGI middleware of the server: a span per ``/v1`` request, continuing the caller's trace (``traceparent``,
and the job id in ``baggage``), and the request id, trace id and job id on every log line written meanwhile."""

from __future__ import annotations

import logging
import time

from opentelemetry.trace import SpanKind
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from telemetry import tracing

log = logging.getLogger("agents.runtime.server.access")


class TraceMiddleware:
    """Inside ``RequestIdMiddleware`` (it reads the request id that one chose)."""

    def __init__(self, app: ASGIApp, service: str = "day0-runtime") -> None:
        self.app = app
        tracing.configure(service)
        tracing.install_log_context()  # the root logger's handlers, and uvicorn's: its access line is written
        for name in ("uvicorn.access", "uvicorn.error"):  # while the response starts, inside the request's span
            tracing.install_log_context(logging.getLogger(name).handlers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1"):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        parent = tracing.extract({k: headers.get(k) for k in ("traceparent", "tracestate", "baggage")})
        request_id = scope.get("state", {}).get("request_id")
        method, path = scope["method"], scope["path"]
        status = 500
        started = time.perf_counter()
        with tracing.request_context(request_id), tracing.span(
                f"{method} {path}", kind=SpanKind.SERVER, parent=parent, **{
                    "http.request.method": method, "url.path": path, "day0.request_id": request_id}) as current:

            async def send_status(message: Message) -> None:
                nonlocal status
                if message["type"] == "http.response.start":
                    status = message["status"]
                    current.set_attribute("http.response.status_code", status)
                await send(message)

            try:
                await self.app(scope, receive, send_status)
            finally:
                # uvicorn's access line says as much at INFO; this one adds the time taken
                log.debug("%s %s %d in %.3f s", method, path, status, time.perf_counter() - started)
