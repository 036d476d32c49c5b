"""Start the server on a model directory: the HTTP port opens at once (``/health``), the weights load in the
engine thread, ``/ready`` turns 200 after the warm-up step."""

from __future__ import annotations

import gc
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import uvicorn

from agents.runtime.server.app import create_app
from agents.runtime.server.middleware import DEFAULT_MAX_BODY_BYTES

log = logging.getLogger(__name__)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def build_server(
    model_dir: str | Path,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    model_name: str | None = None,
    log_level: str = "info",
    on_engine: Callable[[Any], None] | None = None,
    api_key: str | None = None,
    allowed_origins: Sequence[str] = (),
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    image_limits: Any = None,
    bind_threads: bool | None = False,
    tool_parser: str = "auto",
    reasoning_parser: str = "auto",
    **engine_settings: Any,
) -> uvicorn.Server:
    """A uvicorn server whose app loads ``model_dir`` in its engine thread; a failed load stops the server.
    ``on_engine`` runs on the built engine before it serves (tensor parallelism attaches its ranks there).
    ``api_key`` None: ``DAY0_API_KEY`` from the environment, if set. ``bind_threads`` (CPU only; None is auto,
    see ``threads.plan_binding``) pins the engine thread's compute threads to cores before the weights load."""
    from agents.runtime.engine import LLMEngine

    model_dir = Path(model_dir)
    if not (model_dir / "config.json").exists():
        raise FileNotFoundError(f"{model_dir}: no config.json (not a model directory)")
    holder: dict[str, uvicorn.Server] = {}

    def fatal(message: str) -> None:
        log.error("stopping: %s", message)
        holder["server"].should_exit = True

    def factory() -> LLMEngine:
        if bind_threads is not False and str(engine_settings.get("device", "cpu")).startswith("cpu"):
            from agents.runtime.threads import bind_engine_threads

            bind_engine_threads(bind_threads)  # this is the engine thread: its team runs every step
        engine = LLMEngine(model_dir, **engine_settings)
        if on_engine is not None:
            on_engine(engine)
        return engine

    app = create_app(
        factory,
        model_name or model_dir.name,
        on_fatal=fatal,
        api_key=api_key if api_key is not None else os.environ.get("DAY0_API_KEY") or None,
        allowed_origins=allowed_origins,
        max_body_bytes=max_body_bytes,
        image_limits=image_limits,
        tool_parser=tool_parser,
        reasoning_parser=reasoning_parser,
    )
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    holder["server"] = server
    return server


def freeze_heap() -> int:
    """Collect once, then move every object the process holds (the model's modules and parameters' wrappers,
    the tokenizer, torch's and transformers' own) to the collector's permanent generation; returns how many.
    A full collection, which the requests' garbage triggers now and then, walks only what was made since: with
    SmolLM2-135M served, one walked 182k objects in 163 ms, holding the GIL, so the engine loop's step waited
    for it. For a process that serves and nothing else (``serve``): a frozen object that later becomes cyclic
    garbage is not reclaimed."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def serve(model_dir: str | Path, **kwargs: Any) -> int:
    """Run until interrupted; exit code 1 when the model could not be loaded. Once the engine is built, the
    heap so far is frozen (``freeze_heap``)."""
    torch_threads = os.environ.get("DAY0_TORCH_THREADS")
    if torch_threads:
        import torch

        torch.set_num_threads(int(torch_threads))
    hook = kwargs.pop("on_engine", None)

    def on_engine(engine: Any) -> None:
        if hook is not None:
            hook(engine)
        log.info("garbage collector: %d objects made while starting frozen", freeze_heap())

    server = build_server(model_dir, on_engine=on_engine, **kwargs)
    server.run()
    app_state = server.config.app.state  # type: ignore[union-attr]
    return 1 if app_state.runtime.error else 0


class ServerThread:
    """A uvicorn server on a background thread (tests and benchmarks): ``with ServerThread(app) as url:``.
    ``wait_ready`` (default): the block starts once ``/ready`` answers (the engine has warmed up, or failed, or
    the app has no such route), so the first request never races the warm-up step."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int | None = None, *, wait_ready: bool = True,
                 ready_timeout: float = 120.0) -> None:
        self.wait_ready, self.ready_timeout = wait_ready, ready_timeout
        self.port = port or free_port(host)
        self.url = f"http://{host}:{self.port}"
        config = uvicorn.Config(app, host=host, port=self.port, log_level="warning", timeout_graceful_shutdown=2)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("server thread died during startup")
            threading.Event().wait(0.02)
        if self.wait_ready:
            self._await_ready()
        return self.url

    def _await_ready(self) -> None:
        import httpx

        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            try:
                r = httpx.get(f"{self.url}/ready", timeout=5)
                if r.status_code != 503 or r.json().get("status") == "failed":
                    return  # ready, failed (the requests will say so), or an app without /ready
            except (httpx.HTTPError, ValueError):
                pass
            threading.Event().wait(0.05)
        raise RuntimeError(f"{self.url}/ready not ready after {self.ready_timeout:.0f} s")

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)
