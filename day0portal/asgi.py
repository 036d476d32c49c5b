"""ASGI entry point: ``http`` goes to Django; ``websocket`` to the routes of ``apps.jobs.routing`` (a job's events
at ``/ws/jobs/<id>/``) and ``apps.matrix.routing`` (cell changes at ``/ws/matrix/``), behind Channels'
allowed-hosts origin check and session authentication (the consumers also take ``?token=``)."""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "day0portal.settings")
django_asgi_app = get_asgi_application()  # sets Django up before any consumer module imports models

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from apps.jobs.routing import websocket_urlpatterns as job_sockets  # noqa: E402  (/ws/jobs/<id>/)
from apps.matrix.routing import websocket_urlpatterns as matrix_sockets  # noqa: E402  (/ws/matrix/)
from apps.ops.asgi import CountConnections  # noqa: E402  (the portal's WebSocket gauge)

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": CountConnections(
            AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(job_sockets + matrix_sockets)))
        ),
    }
)
