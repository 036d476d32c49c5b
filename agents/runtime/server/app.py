"""The OpenAI-compatible ASGI app: completions and chat completions (streamed over SSE or not, several
prompts and choices per request, logprobs), models, health, readiness and Prometheus metrics; a body size
limit, an optional API key, optional CORS and a request id on every response."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from agents.runtime.engine import LLMEngine, QueueFullError, RequestError
from agents.runtime.engine.multimodal import ImageInputs
from agents.runtime.engine.tokenizer import ChatFormatError
from agents.runtime.server.async_engine import AsyncEngine
from agents.runtime.server.errors import APIError
from agents.runtime.server.fields import parse_json
from agents.runtime.server.images import (
    ImageLimits,
    ImageProcessor,
    decode_images,
    image_parts,
    processor_for,
    with_placeholders,
)
from agents.runtime.server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from agents.runtime.server.middleware import (
    DEFAULT_MAX_BODY_BYTES,
    ApiKeyMiddleware,
    RequestIdMiddleware,
    read_body_limited,
)
from agents.runtime.server.protocol import (
    MAX_CHOICES,
    Generation,
    chat_generation,
    check_model,
    completion_generation,
    completion_prompts,
)
from agents.runtime.server.render import ChatRenderer, Choice, Renderer
from agents.runtime.server.sse import SSEResponse, collect_unless_disconnected
from agents.runtime.server.trace import TraceMiddleware

log = logging.getLogger(__name__)
INLINE_PARSE_BYTES = 64 * 1024  # bodies above this are parsed in a worker thread, off the event loop


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
) -> Starlette:
    """``engine``: a built engine, a factory building one in the engine thread, or an ``AsyncEngine``.
    ``api_key``: ``/v1/*`` then needs ``Authorization: Bearer <key>``. ``allowed_origins``: CORS origins
    (``*`` for any). ``max_body_bytes``: larger request bodies are a 413. ``image_limits``: bounds on a chat
    request's images (and whether remote URLs are fetched)."""
    if max_body_bytes < 1024:
        raise ValueError(f"max_body_bytes must be at least 1024, got {max_body_bytes}")
    runtime = engine if isinstance(engine, AsyncEngine) else AsyncEngine(engine, warmup=warmup, on_fatal=on_fatal)
    runtime.metrics.bind(model_name, lambda: runtime.engine if runtime.ready else None)
    started = time.time()
    limits = image_limits or ImageLimits()
    processors: dict[int, ImageProcessor | None] = {}  # per engine: its model's image processor, if any

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        runtime.start()
        yield
        runtime.stop()

    def ready_engine() -> LLMEngine:
        if not runtime.ready:
            raise APIError(503, runtime.error or "the model is still loading", err_type="server_error")
        return runtime.engine

    async def read_body(request: Request) -> dict[str, Any]:
        raw = await read_body_limited(request, max_body_bytes)
        body = parse_json(raw) if len(raw) <= INLINE_PARSE_BYTES else await run_in_threadpool(parse_json, raw)
        check_model(body, model_name)
        return body

    def guarded(handler: Callable) -> Callable:
        async def endpoint(request: Request) -> Response:
            try:
                return await handler(request)
            except APIError as exc:
                runtime.metrics.count_error(exc.status)
                return exc.response()
            except Exception as exc:  # a bug in one request must not take the server down
                log.exception("request failed")
                runtime.metrics.count_error(500)
                return APIError(500, f"internal error: {type(exc).__name__}: {exc}").response()

        return endpoint

    def check_chars(engine: LLMEngine, prompt: str, param: str) -> None:
        """A text too long to fit the context whatever its tokens is refused without tokenizing it."""
        bound = 4 * engine.tokenizer.max_token_chars * engine.max_model_len
        if len(prompt) > bound:
            raise APIError(400, f"{param} of {len(prompt)} characters cannot fit the model's context of "
                                f"{engine.max_model_len} tokens", param)

    async def tokenize(engine: LLMEngine, prompt: str, param: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of a text prompt, in a worker thread (a long prompt must not stall ``/health``)."""
        check_chars(engine, prompt, param)
        return await run_in_threadpool(engine.tokenizer.encode, prompt, add_special_tokens)

    async def serve_choices(
        request: Request, engine: LLMEngine, gen: Generation, choices: list[Choice], renderer_cls: type[Renderer],
        images: ImageInputs | None = None,
    ) -> Response:
        requests = [(c.prompt_ids, gen.choice_params(c.index % gen.n)) for c in choices]
        try:
            group = runtime.generate_group(requests, images)
        except RequestError as exc:
            raise APIError(400, str(exc), "prompt") from exc
        except QueueFullError as exc:
            raise APIError(429, str(exc), err_type="rate_limit_exceeded") from exc
        tok = engine.tokenizer
        renderer = renderer_cls(model_name, request.state.request_id, gen, choices, tok.token_text, tok.visible_len)
        if gen.stream:
            return SSEResponse(renderer.stream(group), group)
        outputs = await collect_unless_disconnected(request, group)
        if outputs is None:
            return Response(status_code=499)  # the client left; nobody reads this
        if gen.logprobs is None:
            return JSONResponse(renderer.whole(outputs))
        return JSONResponse(await run_in_threadpool(renderer.whole, outputs))  # token texts of every position

    async def completions(request: Request) -> Response:
        engine = ready_engine()
        body = await read_body(request)
        prompts = completion_prompts(body)
        gen = completion_generation(body, max_model_len=engine.max_model_len)
        if len(prompts) * gen.n > MAX_CHOICES:
            raise APIError(400, f"{len(prompts)} prompts x n={gen.n} choices is over {MAX_CHOICES} per request", "n")
        choices: list[Choice] = []
        for i, prompt in enumerate(prompts):
            if isinstance(prompt, str):
                ids, text = await tokenize(engine, prompt, "prompt"), prompt
            elif len(prompt) >= engine.max_model_len:  # refused before decoding it for an echo
                raise APIError(400, f"prompt {i} is {len(prompt)} tokens, the model's context is "
                                    f"{engine.max_model_len}", "prompt")
            elif not all(0 <= t < engine.vocab_size for t in prompt):
                raise APIError(400, f"prompt {i}: token ids must be in [0, {engine.vocab_size})", "prompt")
            else:
                ids, text = prompt, await run_in_threadpool(engine.tokenizer.decode, prompt) if gen.echo else ""
            for j in range(gen.n):
                choices.append(Choice(len(choices), ids, text, counts_prompt=j == 0))
        return await serve_choices(request, engine, gen, choices, Renderer)

    async def chat_completions(request: Request) -> Response:
        engine = ready_engine()
        body = await read_body(request)
        messages = body.get("messages")
        parts = image_parts(messages)
        processor = None
        if parts:
            if id(engine) not in processors:
                try:
                    processors[id(engine)] = processor_for(engine.model_dir, engine.model)
                except FileNotFoundError as exc:
                    raise APIError(500, f"cannot preprocess images: {exc}") from exc
            processor = processors[id(engine)]
            if processor is None:
                raise APIError(400, f"{parts[0][0]}: this model does not take images (a text-only model)",
                               parts[0][0])
            pictures = await run_in_threadpool(decode_images, messages, limits)
            messages = with_placeholders(messages, processor.placeholder)
        try:
            text = await run_in_threadpool(engine.tokenizer.apply_chat_template, messages)
        except ChatFormatError as exc:
            raise APIError(400, str(exc), "messages") from exc
        images = None
        if processor is not None:  # the model's processor: pixel values, each placeholder expanded
            check_chars(engine, text, "messages")
            ids, images = await run_in_threadpool(processor, text, pictures)
        else:
            ids = await tokenize(engine, text, "messages", add_special_tokens=False)  # the template writes the BOS
        gen = chat_generation(body, max_model_len=engine.max_model_len, prompt_tokens=len(ids))
        choices = [Choice(j, ids, "", counts_prompt=j == 0) for j in range(gen.n)]
        return await serve_choices(request, engine, gen, choices, ChatRenderer, images)

    def model_card() -> dict[str, Any]:
        engine = runtime.engine if runtime.ready else None
        return {
            "id": model_name,
            "object": "model",
            "created": int(started),
            "owned_by": "day0",
            "max_model_len": engine.max_model_len if engine else None,
            "vocab_size": engine.vocab_size if engine else None,
            **({"modalities": ["text", "image"], "image_token_id": engine.model.image_token_id}
               if engine and getattr(engine.model, "takes_images", False) else {}),
        }

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [model_card()]})

    async def model(request: Request) -> Response:
        wanted = request.path_params["model_id"]
        if wanted != model_name:
            raise APIError(404, f"The model '{wanted[:200]}' does not exist; this server serves '{model_name}'",
                           "model", code="model_not_found")
        return JSONResponse(model_card())

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def ready(request: Request) -> Response:
        if runtime.ready:
            return JSONResponse({"status": "ready"})
        status = "failed" if runtime.error else "loading"
        return JSONResponse({"status": status, "error": runtime.error}, status_code=503)

    async def metrics(request: Request) -> Response:
        text = await run_in_threadpool(runtime.metrics.render, runtime.stats)  # may ask the other ranks
        return PlainTextResponse(text, media_type=METRICS_CONTENT_TYPE)

    async def expert_load(request: Request) -> Response:
        engine = runtime.engine if runtime.ready else None
        if engine is None or not engine.expert_load.active:
            return APIError(404, "this model has no routed experts (or is still loading)").response()
        return JSONResponse({"counts": engine.expert_load.counts(), "ep_size": engine.expert_load.ep_size})

    async def comm_timer(request: Request) -> Response:
        """GET: this rank's time in collectives and in steps so far; POST ``{"enabled": bool}``: start timing
        from zero, or stop (answering the totals). Timing synchronises the device per collective: only on ask."""
        from agents.runtime.distributed import COMM_TIMER

        if request.method == "POST":
            body = parse_json(await read_body_limited(request, 4096))
            enabled = body.get("enabled") if isinstance(body, dict) else None
            if not isinstance(enabled, bool):
                raise APIError(400, "'enabled' must be true or false", "enabled")
            totals = COMM_TIMER.snapshot()
            COMM_TIMER.enable(enabled)
            return JSONResponse(totals if not enabled else COMM_TIMER.snapshot())
        return JSONResponse(COMM_TIMER.snapshot())

    async def compile_stats(request: Request) -> Response:
        """The compiled path's evidence (``engine/compiled.py``): compile seconds, graphs, graph breaks,
        recompiles, compilation-cache hits and misses; ``{"enabled": false}`` when the server runs eager."""
        engine = runtime.engine if runtime.ready else None
        if engine is None:
            return APIError(503, "the engine is still loading (or failed to start): see /ready").response()
        compiled = getattr(engine, "compiled", None)
        if compiled is None:
            return JSONResponse({"enabled": False, "reason": "this server runs eager (day0 serve --compile)"})
        return JSONResponse(compiled.stats.report())

    async def memory_stats(request: Request) -> Response:
        """This server's device memory: torch's CUDA allocator (allocated now and at most, reserved); on CPU
        there is no device memory apart from the process's resident memory, and the answer says so."""
        engine = runtime.engine if runtime.ready else None
        device = engine.device if engine is not None else None
        if device is not None and device.type == "cuda":
            import torch

            return JSONResponse({"device": str(device), "source": "torch.cuda",
                                 "allocated_bytes": int(torch.cuda.memory_allocated(device)),
                                 "max_allocated_bytes": int(torch.cuda.max_memory_allocated(device)),
                                 "reserved_bytes": int(torch.cuda.memory_reserved(device))})
        import resource

        with open("/proc/self/statm") as statm:
            rss = int(statm.read().split()[1]) * resource.getpagesize()
        return JSONResponse({"device": str(device) if device is not None else None, "source": "cpu: process RSS",
                             "rss_bytes": rss})

    routes = [
        Route("/v1/completions", guarded(completions), methods=["POST"]),
        Route("/v1/chat/completions", guarded(chat_completions), methods=["POST"]),
        Route("/v1/models", models),
        Route("/v1/models/{model_id:path}", guarded(model)),
        Route("/health", health),
        Route("/ready", ready),
        Route("/metrics", metrics),
        Route("/stats/experts", expert_load),
        Route("/stats/comm", guarded(comm_timer), methods=["GET", "POST"]),
        Route("/stats/compile", guarded(compile_stats)),
        Route("/stats/memory", guarded(memory_stats)),
    ]

    async def http_error(request: Request, exc: HTTPException) -> Response:
        return APIError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}").response()

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
    app = Starlette(routes=routes, lifespan=lifespan, middleware=middleware,
                    exception_handlers={HTTPException: http_error})
    app.state.runtime = runtime
    return app



