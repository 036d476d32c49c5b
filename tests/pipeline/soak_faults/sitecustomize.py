"""Planted faults for the soak tests, loaded into ``day0 serve`` children through PYTHONPATH (a test-only
directory; the runtime has no such hooks). ``DAY0_TEST_LEAK_BYTES``: every HTTP request appends that many
bytes to a cache that is never freed. ``DAY0_TEST_NO_RESTART``: a marker file; a server started when it
exists exits at once with code 3, so a restart never comes back."""

from __future__ import annotations

import os
import sys

_LEAK = int(os.environ.get("DAY0_TEST_LEAK_BYTES") or 0)
_MARKER = os.environ.get("DAY0_TEST_NO_RESTART")

if _MARKER and "serve" in sys.argv:
    if os.path.exists(_MARKER):
        sys.exit(3)
    open(_MARKER, "w").close()

if _LEAK and "serve" in sys.argv:
    import agents.runtime.server.launcher as _launcher

    _original = _launcher.create_app
    _cache: list[bytearray] = []

    def _leaky_create_app(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202 (wraps create_app as is)
        app = _original(*args, **kwargs)

        class Leak:
            def __init__(self, inner) -> None:  # noqa: ANN001
                self.inner = inner

            async def __call__(self, scope, receive, send) -> None:  # noqa: ANN001
                if scope["type"] == "http":
                    _cache.append(bytearray(os.urandom(16)) * (_LEAK // 16))  # touched pages: resident
                await self.inner(scope, receive, send)

        app.add_middleware(Leak)
        return app

    _launcher.create_app = _leaky_create_app
