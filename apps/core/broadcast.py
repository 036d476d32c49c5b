"""``group_send`` for synchronous code (views, services, tasks) that publishes to the channel layer.

``async_to_sync`` outside an event loop starts a fresh loop per call, and channels_redis opens its connections
per loop: about 10 ms per message. With the Redis layer we keep one event loop in a daemon thread (per
process) and submit to it, so connections are reused and a send costs one Redis round trip. The in-memory
layer (embedded default) must be driven on the loop its consumers run on, so it keeps ``async_to_sync``."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import InMemoryChannelLayer, get_channel_layer

logger = logging.getLogger(__name__)
SEND_TIMEOUT_S = 5.0

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_loop_pid: int | None = None


def _background_loop() -> asyncio.AbstractEventLoop:
    global _loop, _loop_pid
    with _lock:
        if _loop is None or _loop_pid != os.getpid() or _loop.is_closed():  # new process after a fork
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="day0-group-send", daemon=True).start()
            _loop, _loop_pid = loop, os.getpid()
        return _loop


def group_send(group: str, message: dict[str, Any]) -> None:
    """Sends ``message`` to ``group``, waiting until the layer took it (keeps a producer's messages in order).
    A failure is logged, never raised: what was sent is already stored, and clients replay from it."""
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        if isinstance(layer, InMemoryChannelLayer):
            async_to_sync(layer.group_send)(group, message)
        else:
            future = asyncio.run_coroutine_threadsafe(layer.group_send(group, message), _background_loop())
            future.result(timeout=SEND_TIMEOUT_S)
    except Exception:
        logger.exception("broadcast to %s failed", group)
