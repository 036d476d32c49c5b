"""The OpenAI-compatible ASGI app: completions and chat completions (streamed over SSE or not), models,
health, readiness and Prometheus metrics."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from agents.runtime.engine import LLMEngine, QueueFullError, RequestError
from agents.runtime.engine.tokenizer import ChatFormatError
from agents.runtime.server.async_engine import AsyncEngine
from agents.runtime.server.protocol import APIError, check_model, completion_prompt, include_usage, sampling_params
from agents.runtime.server.render import ChatRenderer, Renderer
from agents.runtime.server.sse import SSEResponse, collect_unless_disconnected


def create_app(
    engine: LLMEngine | AsyncEngine | Callable[[], LLMEngine],
    model_name: str,
    *,
    warmup: bool = True,
    on_fatal: Callable[[str], None] | None = None,
) -> Starlette:
    """``engine``: a built engine, a factory building one in the engine thread, or an ``AsyncEngine``."""
    runtime = engine if isinstance(engine, AsyncEngine) else AsyncEngine(engine, warmup=warmup, on_fatal=on_fatal)
    started = time.time()

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        runtime.start()
        yield
        runtime.stop()

    def ready_engine() -> LLMEngine:
        if not runtime.ready:
            raise APIError(503, runtime.error or "the model is still loading", err_type="server_error")
        return runtime.engine

    async def read_body(request: Request, served: str) -> dict[str, Any]:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise APIError(400, f"request body is not valid JSON: {exc}") from exc
        if not isinstance(body, dict):
            raise APIError(400, "request body must be a JSON object")
        check_model(body, served)
        return body

    def guarded(handler: Callable) -> Callable:
        async def endpoint(request: Request) -> Response:
            try:
                return await handler(request)
            except APIError as exc:
                runtime.metrics.count_error(exc.status)
                return exc.response()
            except Exception as exc:  # a bug in one request must not take the server down
                logging.getLogger(__name__).exception("request failed")
                runtime.metrics.count_error(500)
                return APIError(500, f"internal error: {type(exc).__name__}: {exc}").response()

        return endpoint

    async def serve_request(
        request: Request, prompt_ids: list[int], params: Any, body: dict, renderer: Renderer
    ) -> Response:
        try:
            gen = runtime.generate(prompt_ids, params)
        except RequestError as exc:
            raise APIError(400, str(exc), "prompt") from exc
        except QueueFullError as exc:
            raise APIError(429, str(exc), err_type="rate_limit_exceeded") from exc
        if body.get("stream", False):
            return SSEResponse(renderer.stream(gen, include_usage(body)), gen)
        outputs = await collect_unless_disconnected(request, gen)
        if outputs is None:
            return Response(status_code=499)  # the client left; nobody reads this
        final = outputs[-1]
        if final.finish_reason == "error":
            raise APIError(500, f"generation failed: {final.error}")
        return JSONResponse(renderer.whole("".join(o.new_text for o in outputs), final))

    async def completions(request: Request) -> Response:
        engine = ready_engine()
        body = await read_body(request, model_name)
        prompt = completion_prompt(body)
        ids = engine.tokenizer.encode(prompt) if isinstance(prompt, str) else prompt
        params = sampling_params(body, max_model_len=engine.max_model_len, default_max_tokens=16)
        return await serve_request(request, ids, params, body, Renderer(model_name))

    async def chat_completions(request: Request) -> Response:
        engine = ready_engine()
        body = await read_body(request, model_name)
        try:
            ids = engine.tokenizer.encode_chat(body.get("messages"))
        except ChatFormatError as exc:
            raise APIError(400, str(exc), "messages") from exc
        room = max(1, engine.max_model_len - len(ids))
        params = sampling_params(body, max_model_len=engine.max_model_len, default_max_tokens=room)
        return await serve_request(request, ids, params, body, ChatRenderer(model_name))

    async def models(request: Request) -> Response:
        engine = runtime.engine if runtime.ready else None
        card = {
            "id": model_name,
            "object": "model",
            "created": int(started),
            "owned_by": "day0",
            "max_model_len": engine.max_model_len if engine else None,
            "vocab_size": engine.vocab_size if engine else None,
        }
        return JSONResponse({"object": "list", "data": [card]})

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def ready(request: Request) -> Response:
        if runtime.ready:
            return JSONResponse({"status": "ready"})
        status = "failed" if runtime.error else "loading"
        return JSONResponse({"status": status, "error": runtime.error}, status_code=503)

    async def metrics(request: Request) -> Response:
        return PlainTextResponse(runtime.metrics.render(runtime.stats), media_type="text/plain; version=0.0.4")

    async def expert_load(request: Request) -> Response:
        engine = runtime.engine if runtime.ready else None
        if engine is None or not engine.expert_load.active:
            return APIError(404, "this model has no routed experts (or is still loading)").response()
        return JSONResponse({"counts": engine.expert_load.counts()})

    routes = [
        Route("/v1/completions", guarded(completions), methods=["POST"]),
        Route("/v1/chat/completions", guarded(chat_completions), methods=["POST"]),
        Route("/v1/models", models),
        Route("/health", health),
        Route("/ready", ready),
        Route("/metrics", metrics),
        Route("/stats/experts", expert_load),
    ]

    async def http_error(request: Request, exc: HTTPException) -> Response:
        return APIError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}").response()

    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: http_error})
    app.state.runtime = runtime
    return app
