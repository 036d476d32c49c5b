"""What tests that start real servers share: a free local port and the test database's URL for child processes."""

from __future__ import annotations

import socket

import pytest
from django.conf import settings


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def database_url(purpose: str) -> str:
    """``postgres://…`` of the test database, for processes started by a test (``purpose`` names them in the
    failure when the suite does not run on PostgreSQL)."""
    db = settings.DATABASES["default"]
    if "postgresql" not in db["ENGINE"]:
        pytest.fail(f"{purpose} need PostgreSQL: set DAY0_DATABASE_URL=postgres://… (see `make test`)")
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    return (f"postgres://{db.get('USER') or 'postgres'}{password}@{db.get('HOST') or '127.0.0.1'}:"
            f"{db.get('PORT') or 5432}/{db['NAME']}")
