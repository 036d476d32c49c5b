"""The engine loop in its own thread, handing each request's outputs to its asyncio queue."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from agents.runtime.engine import LLMEngine, RequestError, RequestOutput, SamplingParams
from agents.runtime.engine.multimodal import ImageInputs
from agents.runtime.server.metrics import ServerMetrics

log = logging.getLogger(__name__)


class AsyncEngine:
    """Wraps an ``LLMEngine`` (or a factory that builds one in the loop thread, so the server answers
    ``/health`` while weights load). ``ready`` turns true after one warm-up step."""

    def __init__(
        self,
        engine: LLMEngine | Callable[[], LLMEngine],
        metrics: ServerMetrics | None = None,
        *,
        warmup: bool = True,
        on_fatal: Callable[[str], None] | None = None,
    ) -> None:
        self._factory = engine if callable(engine) and not isinstance(engine, LLMEngine) else None
        self.engine: LLMEngine | None = None if self._factory else engine  # type: ignore[assignment]
        self.metrics = metrics or ServerMetrics()
        self.warmup = warmup
        self.on_fatal = on_fatal
        self.ready = False
        self.error: str | None = None
        self._queues: dict[str, asyncio.Queue[RequestOutput]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.engine is not None:
            self.engine.close()

    def _run(self) -> None:
        try:
            if self.engine is None:
                self.engine = self._factory()
            if self.warmup:
                self.engine.warmup()
            self.ready = True
            log.info("engine ready")
        except Exception as exc:
            log.exception("engine failed to start")
            self.error = f"{type(exc).__name__}: {exc}"
            if self.on_fatal:
                self.on_fatal(self.error)
            return
        engine = self.engine
        while not self._stop.is_set():
            self._wake.clear()
            if not engine.has_unfinished():
                self._wake.wait(0.5)
                continue
            started = time.perf_counter()
            try:
                outputs = engine.step()
            except Exception as exc:  # a bug outside the forward pass: end what is in flight, keep the loop
                log.exception("engine step failed; ending the requests in flight")
                outputs = engine.fail_all(f"{type(exc).__name__}: {exc}")
            self.metrics.observe_step(time.perf_counter() - started)
            if outputs:
                self.metrics.observe(outputs)
                self._loop.call_soon_threadsafe(self._dispatch, outputs)

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            queue = self._queues.get(out.request_id)
            if queue is not None:
                queue.put_nowait(out)

    def stats(self) -> dict[str, Any]:
        return self.engine.stats() if self.engine is not None and self.ready else {}

    def generate(self, prompt: str | list[int], params: SamplingParams,
                 images: ImageInputs | None = None) -> RequestStream:
        """Queue a request (RequestError / QueueFullError raised here) and return its output stream."""
        request_id = uuid.uuid4().hex
        queue: asyncio.Queue[RequestOutput] = asyncio.Queue()
        self._queues[request_id] = queue
        try:
            self.engine.add_request(prompt, params, request_id, images=images)
        except Exception:
            self._queues.pop(request_id, None)
            raise
        self._wake.set()
        return RequestStream(self, request_id, queue)

    def generate_group(self, requests: list[tuple[list[int], SamplingParams]],
                       images: ImageInputs | None = None) -> RequestGroup:
        """Queue several requests (the choices of one HTTP request) together: if one is refused, the ones
        already queued are aborted and the error is raised. ``images``: shared by the choices (encoded once)."""
        streams: list[RequestStream] = []
        try:
            for prompt, params in requests:
                streams.append(self.generate(prompt, params, images))
        except Exception as exc:
            for stream in streams:
                stream.close()
            if len(requests) > 1 and isinstance(exc, RequestError):
                raise RequestError(f"choice {len(streams)}: {exc}") from exc  # which prompt of the batch
            raise
        return RequestGroup(streams)

    def _release(self, request_id: str, finished: bool) -> None:
        self._queues.pop(request_id, None)
        if not finished:
            self.engine.abort(request_id)
            self._wake.set()


class RequestStream:
    """Async iterator over one request's outputs; ``close()`` (or leaving early) aborts it and frees its blocks."""

    def __init__(self, owner: AsyncEngine, request_id: str, queue: asyncio.Queue[RequestOutput]) -> None:
        self.owner = owner
        self.request_id = request_id
        self.queue = queue
        self.finished = False
        self.closed = False

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished or self.closed:
            raise StopAsyncIteration
        out = await self.queue.get()
        if out.finished:
            self.finished = True
            self.close()
        return out

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.owner._release(self.request_id, self.finished)


class RequestGroup:
    """The streams of one HTTP request's choices, merged: iterates ``(choice index, output)`` in the order the
    engine produced them; ``close()`` aborts every choice still running."""

    def __init__(self, streams: list[RequestStream]) -> None:
        self.streams = streams
        self._queue: asyncio.Queue[tuple[int, RequestOutput | None]] = asyncio.Queue()
        self._tasks: list[asyncio.Task] = []
        self._remaining = len(streams)

    def __aiter__(self) -> RequestGroup:
        if not self._tasks:
            self._tasks = [asyncio.create_task(self._pump(i, s)) for i, s in enumerate(self.streams)]
        return self

    async def _pump(self, index: int, stream: RequestStream) -> None:
        try:
            async for out in stream:
                self._queue.put_nowait((index, out))
        finally:
            self._queue.put_nowait((index, None))

    async def __anext__(self) -> tuple[int, RequestOutput]:
        while self._remaining:
            index, out = await self._queue.get()
            if out is not None:
                return index, out
            self._remaining -= 1
        raise StopAsyncIteration

    def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for stream in self.streams:
            stream.close()
