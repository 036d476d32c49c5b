"""ASGI entry point: ``http`` goes to Django, ``websocket`` to the Channels consumers of ``apps.*.routing``."""

from __future__ import annotations

import importlib
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "day0portal.settings")
django_asgi_app = get_asgi_application()  # sets Django up before any consumer module imports models

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

# Apps that may expose ``websocket_urlpatterns`` in their ``routing.py``; one not written yet is skipped.
ROUTING_MODULES: tuple[str, ...] = ("apps.jobs.routing", "apps.matrix.routing")


def websocket_urlpatterns() -> list:
    patterns: list = []
    for name in ROUTING_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue
            raise
        patterns.extend(getattr(module, "websocket_urlpatterns", []))
    return patterns


application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns()))),
    }
)
