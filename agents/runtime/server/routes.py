"""The server's route table: each path bound to its handler and the ``ServerState``; the guarded ones answer an
``APIError`` as its JSON error (and a bug as a 500) instead of taking the server down, counting each error."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from agents.runtime.server.errors import APIError
from agents.runtime.server.handlers import generate, models, stats, status
from agents.runtime.server.handlers.common import ServerState

log = logging.getLogger(__name__)
Handler = Callable[[ServerState, Request], Awaitable[Response]]


def bound(state: ServerState, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    """``handler`` as a Starlette endpoint of this server."""

    async def endpoint(request: Request) -> Response:
        return await handler(state, request)

    return endpoint


def guarded(state: ServerState, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    """``handler`` as an endpoint whose errors are answered (and counted) instead of raised."""

    async def endpoint(request: Request) -> Response:
        try:
            return await handler(state, request)
        except APIError as exc:
            state.runtime.metrics.count_error(exc.status)
            return exc.response()
        except Exception as exc:  # a bug in one request must not take the server down
            log.exception("request failed")
            state.runtime.metrics.count_error(500)
            return APIError(500, f"internal error: {type(exc).__name__}: {exc}").response()

    return endpoint


def routes(state: ServerState) -> list[Route]:
    return [
        Route("/v1/completions", guarded(state, generate.completions), methods=["POST"]),
        Route("/v1/chat/completions", guarded(state, generate.chat_completions), methods=["POST"]),
        Route("/v1/models", bound(state, models.models)),
        Route("/v1/models/{model_id:path}", guarded(state, models.model)),
        Route("/health", bound(state, status.health)),
        Route("/ready", bound(state, status.ready)),
        Route("/metrics", bound(state, status.metrics)),
        Route("/stats/experts", bound(state, stats.expert_load)),
        Route("/stats/comm", guarded(state, stats.comm_timer), methods=["GET", "POST"]),
        Route("/stats/compile", guarded(state, stats.compile_stats)),
        Route("/stats/memory", guarded(state, stats.memory_stats)),
    ]


async def http_error(request: Request, exc: HTTPException) -> Response:
    """Starlette's own errors (no such path, a method not allowed) in the API's error shape."""
    return APIError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}").response()
