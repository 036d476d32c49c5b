"""ASGI middleware of the server: a request id on every response, the API key on ``/v1/*``, and reading a
request body within a size limit."""

from __future__ import annotations

import hmac
import re
import uuid

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agents.runtime.server.errors import APIError

REQUEST_ID_HEADER = "x-request-id"
REQUEST_ID_PATTERN = re.compile(r"[A-Za-z0-9._:\-]{1,128}")
DEFAULT_MAX_BODY_BYTES = 8 * 2**20


class RequestIdMiddleware:
    """Every HTTP response carries ``X-Request-Id``: the client's when it sent a valid one (1-128 characters
    of letters, digits and ``._:-``), else a new one; the handlers read it from ``request.state.request_id``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = Headers(scope=scope).get(REQUEST_ID_HEADER)
        request_id = uuid.uuid4().hex
        if given is not None and not REQUEST_ID_PATTERN.fullmatch(given):
            message = "X-Request-Id must be 1-128 characters of letters, digits and '._:-'"
            await APIError(400, message, "X-Request-Id").response({"X-Request-Id": request_id})(scope, receive, send)
            return
        request_id = given or request_id
        scope.setdefault("state", {})["request_id"] = request_id

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"x-request-id"]
                message = {**message, "headers": [*headers, (b"x-request-id", request_id.encode())]}
            await send(message)

        await self.app(scope, receive, send_with_id)


class ApiKeyMiddleware:
    """``/v1/*`` needs ``Authorization: Bearer <key>`` (as vLLM's ``--api-key``); ``/health``, ``/ready`` and
    ``/metrics`` stay open for probes. CORS preflights (OPTIONS) are answered before this runs."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1") and scope["method"] != "OPTIONS":
            given = Headers(scope=scope).get("authorization", "").encode("latin-1", "replace")
            if not hmac.compare_digest(given, self.expected):
                error = APIError(401, "a valid API key is required: 'Authorization: Bearer <key>'",
                                 err_type="authentication_error", code="invalid_api_key")
                await error.response({"WWW-Authenticate": "Bearer"})(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def read_body_limited(request: Request, limit: int) -> bytes:
    """The request body, refused with 413 as soon as its declared or received size passes ``limit``."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise APIError(400, f"Content-Length {declared[:40]!r} is not a byte count")
        if int(declared) > limit:
            raise APIError(413, f"request body of {int(declared)} bytes is over the limit of {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise APIError(413, f"request body is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)
