"""ASGI entry point: ``http`` goes to Django; ``websocket`` to the routes of ``apps.jobs.routing`` (the job's
events at ``/ws/jobs/<id>/`` and the matrix's cell changes at ``/ws/matrix/``, both consumers in
``apps.jobs.consumers``), behind Channels' allowed-hosts origin check and session authentication."""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "day0portal.settings")
django_asgi_app = get_asgi_application()  # sets Django up before any consumer module imports models

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from apps.jobs.routing import websocket_urlpatterns  # noqa: E402  (/ws/jobs/<id>/, /ws/matrix/)

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
