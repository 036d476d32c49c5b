"""Shared test setup. The suite runs against PostgreSQL and Redis (``make test`` sets DAY0_DATABASE_URL and
DAY0_REDIS_URL). Several people may run it at once on one server, so each run gets its own test database
and its own channel-layer prefix."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from rest_framework.test import APIClient

os.environ.setdefault("DAY0_CHANNELS_PREFIX", f"day0test{os.getpid()}")


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix: None) -> None:
    from django.conf import settings

    db = settings.DATABASES["default"]
    if "postgresql" in db["ENGINE"] and not os.environ.get("DAY0_TEST_DATABASE_NAME"):
        db.setdefault("TEST", {})["NAME"] = f"test_{db['NAME']}_{os.getpid()}"


@pytest.fixture(autouse=True, scope="session")
def _isolated_channel_layer() -> Iterator[None]:
    from channels.layers import channel_layers
    from django.conf import settings

    layer = settings.CHANNEL_LAYERS["default"]
    if "CONFIG" in layer:
        layer["CONFIG"]["prefix"] = os.environ["DAY0_CHANNELS_PREFIX"]
    channel_layers.backends.clear()
    yield


@pytest.fixture
def api_client() -> APIClient:
    from rest_framework.test import APIClient

    return APIClient()
