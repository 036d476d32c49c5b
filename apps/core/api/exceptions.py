"""API error answers: DRF's, plus Django's 404/permission/validation errors mapped to JSON, never a 500."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import exceptions
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from apps.core.errors import ConflictError


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, DjangoValidationError):
        detail = exc.message_dict if hasattr(exc, "error_dict") else {"detail": exc.messages}
        exc = exceptions.ValidationError(detail)
    if isinstance(exc, exceptions.ValidationError) and isinstance(exc.detail, dict):
        # one shape for every 400: {"field": ["message", ...]}
        exc.detail = {k: v if isinstance(v, list | dict) else [v] for k, v in exc.detail.items()}
    if isinstance(exc, ConflictError):
        return Response({"detail": str(exc)}, status=409)
    return drf_exception_handler(exc, context)
