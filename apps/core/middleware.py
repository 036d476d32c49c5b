"""Request body limit: anything over ``settings.MAX_BODY_BYTES`` is refused with 413 before a view reads it."""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse


def _too_big(limit: int) -> JsonResponse:
    return JsonResponse({"detail": f"request body is larger than the limit of {limit} bytes"}, status=413)


class BodySizeLimitMiddleware:
    """Refuses bodies larger than the limit, whether announced by Content-Length or streamed without one."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        limit = settings.MAX_BODY_BYTES
        length = request.META.get("CONTENT_LENGTH")
        if length:
            try:
                if int(length) > limit:
                    return _too_big(limit)
            except ValueError:
                return JsonResponse({"detail": f"Content-Length {length!r} is not a number"}, status=400)
        elif request.method in ("POST", "PUT", "PATCH") and request.META.get("HTTP_TRANSFER_ENCODING"):
            try:
                request.body  # noqa: B018 - reads the stream; Django enforces DATA_UPLOAD_MAX_MEMORY_SIZE
            except RequestDataTooBig:
                return _too_big(limit)
        return self.get_response(request)


class RejectNulMiddleware:
    """Answers 400 to a path or query parameter holding a NUL character: PostgreSQL cannot compare text with
    one, so a lookup or filter would otherwise fail inside the database."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if "\x00" in request.path or any("\x00" in k or any("\x00" in v for v in vs) for k, vs in request.GET.lists()):
            return JsonResponse({"detail": "the URL must not contain NUL (%00) characters"}, status=400)
        return self.get_response(request)
