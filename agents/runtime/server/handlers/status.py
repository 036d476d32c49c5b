"""``/health`` (the process answers), ``/ready`` (the engine is loaded) and ``/metrics`` (Prometheus text, rendered
by ``server/metrics.py``)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from agents.runtime.server.handlers.common import ServerState


async def health(state: ServerState, request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def ready(state: ServerState, request: Request) -> Response:
    runtime = state.runtime
    if runtime.ready:
        return JSONResponse({"status": "ready"})
    status = "failed" if runtime.error else "loading"
    return JSONResponse({"status": status, "error": runtime.error}, status_code=503)


async def metrics(state: ServerState, request: Request) -> Response:
    runtime = state.runtime
    return PlainTextResponse(runtime.metrics.render(runtime.stats), media_type="text/plain; version=0.0.4")
