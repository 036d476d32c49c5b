"""Shared API helpers: the request's actor, and 404s that name what was not found."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import Model, QuerySet
from rest_framework.exceptions import NotAuthenticated, NotFound, PermissionDenied
from rest_framework.request import Request

from apps.accounts.access import Actor, actor_for


def get_actor(request: Request) -> Actor:
    return actor_for(request)


def get_or_404(queryset: QuerySet, what: str, **lookup: Any) -> Model:
    """The one row matching ``lookup`` or a 404 whose message names it (e.g. "no model with slug 'x'")."""
    key, value = next(iter(lookup.items()))
    try:
        obj = queryset.filter(**lookup).first()
    except (ValueError, TypeError, DjangoValidationError):  # a value the field cannot hold ("abc" for an id)
        obj = None
    if obj is None:
        raise NotFound(f"no {what} with {key.split('__')[0]} {value!r}")
    return obj


def require(allowed: bool, actor: Actor, message: str) -> None:
    """401 for an anonymous request, 403 with ``message`` for an authenticated one, when not ``allowed``."""
    if allowed:
        return
    if not actor.authenticated:
        raise NotAuthenticated("authentication required: a session or 'Authorization: Token <secret>'")
    raise PermissionDenied(message)
