"""The OpenAI-compatible ASGI app: completions and chat completions (streamed over SSE or not, several
prompts and choices per request, logprobs), models, health, readiness and Prometheus metrics; a body size
limit, an optional API key, optional CORS and a request id on every response. The handlers live in
``handlers/`` and the route table in ``routes.py``; this factory wires them to one server's state."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware

from agents.runtime.engine import LLMEngine
from agents.runtime.server.async_engine import AsyncEngine
from agents.runtime.server.handlers.common import ServerState
from agents.runtime.server.images import ImageLimits
from agents.runtime.server.middleware import DEFAULT_MAX_BODY_BYTES, ApiKeyMiddleware, RequestIdMiddleware
from agents.runtime.server.routes import http_error, routes
from agents.runtime.server.trace import TraceMiddleware


def create_app(
    engine: LLMEngine | AsyncEngine | Callable[[], LLMEngine],
    model_name: str,
    *,
    warmup: bool = True,
    on_fatal: Callable[[str], None] | None = None,
    api_key: str | None = None,
    allowed_origins: Sequence[str] = (),
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    image_limits: ImageLimits | None = None,
    tool_parser: str = "auto",
    reasoning_parser: str = "auto",
) -> Starlette:
    """``engine``: a built engine, a factory building one in the engine thread, or an ``AsyncEngine``.
    ``api_key``: ``/v1/*`` then needs ``Authorization: Bearer <key>``. ``allowed_origins``: CORS origins
    (``*`` for any). ``max_body_bytes``: larger request bodies are a 413. ``image_limits``: bounds on a chat
    request's images (and whether remote URLs are fetched). ``tool_parser`` / ``reasoning_parser``: a parser's name,
    ``auto`` (chosen from the chat template) or ``none``."""
    if max_body_bytes < 1024:
        raise ValueError(f"max_body_bytes must be at least 1024, got {max_body_bytes}")
    runtime = engine if isinstance(engine, AsyncEngine) else AsyncEngine(engine, warmup=warmup, on_fatal=on_fatal)
    runtime.metrics.bind(model_name, lambda: runtime.engine if runtime.ready else None)
    state = ServerState(runtime, model_name, max_body_bytes=max_body_bytes, image_limits=image_limits or ImageLimits(),
                        tool_parser=tool_parser, reasoning_parser=reasoning_parser)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        runtime.start()
        yield
        runtime.stop()

    middleware = []
    if allowed_origins:  # outermost: preflights are answered, and every answer (401s too) carries CORS headers
        middleware.append(Middleware(
            CORSMiddleware, allow_origins=list(allowed_origins), allow_methods=["GET", "POST", "OPTIONS"],
            allow_headers=["Authorization", "Content-Type", "X-Request-Id"], expose_headers=["X-Request-Id"],
        ))
    middleware.append(Middleware(RequestIdMiddleware))
    middleware.append(Middleware(TraceMiddleware))  # a span per /v1 request; ids on its log lines
    if api_key:
        middleware.append(Middleware(ApiKeyMiddleware, api_key=api_key))
    app = Starlette(routes=routes(state), lifespan=lifespan, middleware=middleware,
                    exception_handlers={HTTPException: http_error})
    app.state.runtime = runtime
    app.state.server = state
    return app
