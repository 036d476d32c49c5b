"""``/health`` (the process answers), ``/ready`` (the engine is loaded) and ``/metrics`` (Prometheus text, rendered
by ``server/metrics.py``)."""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from agents.runtime.server.handlers.common import ServerState
from agents.runtime.server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE


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
    text = await run_in_threadpool(runtime.metrics.render, runtime.stats)  # may ask the other ranks
    return PlainTextResponse(text, media_type=METRICS_CONTENT_TYPE)
