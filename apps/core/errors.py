"""Domain errors the API maps to HTTP answers."""

from __future__ import annotations


class ConflictError(Exception):
    """The request is valid but conflicts with the row's current state (HTTP 409)."""
