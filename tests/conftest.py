"""Shared test setup. The suite runs against PostgreSQL and Redis (``make test`` sets DAY0_DATABASE_URL and
DAY0_REDIS_URL). Several people may run it at once on one server, so each run gets its own test database
and its own channel-layer prefix. Transactional tests are emptied with DELETE rather than TRUNCATE (see
``_flush_by_delete``)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from tests.snapshots import Snapshots

if TYPE_CHECKING:
    from rest_framework.test import APIClient

os.environ.setdefault("DAY0_CHANNELS_PREFIX", f"day0test{os.getpid()}")
os.environ.setdefault("DAY0_CACHE_PREFIX", f"day0test{os.getpid()}")  # Django's cache keys (Redis)


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix: None) -> None:
    from django.conf import settings

    db = settings.DATABASES["default"]
    if "postgresql" in db["ENGINE"] and not os.environ.get("DAY0_TEST_DATABASE_NAME"):
        db.setdefault("TEST", {})["NAME"] = f"test_{db['NAME']}_{os.getpid()}"


def _delete_flush(original):  # noqa: ANN001, ANN202
    """PostgreSQL's ``sql_flush`` as one DELETE per table, for the suite's small tables.

    Django ends every transactional test with ``TRUNCATE`` of all tables: each truncated table, index and TOAST
    table gets a new file, which with ``fsync`` on costs ~1.3 s for this schema's 38 tables (~180 relations)
    even when they are empty; ``DELETE`` of the few hundred rows a test leaves takes milliseconds. The foreign
    keys Django creates are ``DEFERRABLE INITIALLY DEFERRED``, so the order of the deletes does not matter.
    ``reset_sequences`` (RESTART IDENTITY) and ``allow_cascade`` (``available_apps``: tables outside the list
    may point in) keep Django's TRUNCATE."""

    def sql_flush(self, style, tables, *, reset_sequences=False, allow_cascade=False):  # noqa: ANN001, ANN202
        if reset_sequences or allow_cascade or not tables:
            return original(self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade)
        return ["SET CONSTRAINTS ALL DEFERRED;", *(
            f"{style.SQL_KEYWORD('DELETE FROM')} {style.SQL_FIELD(self.quote_name(table))};" for table in tables)]

    return sql_flush


@pytest.fixture(autouse=True, scope="session")
def _flush_by_delete() -> Iterator[None]:
    from django.db.backends.postgresql.operations import DatabaseOperations

    original = DatabaseOperations.sql_flush
    DatabaseOperations.sql_flush = _delete_flush(original)
    yield
    DatabaseOperations.sql_flush = original


@pytest.fixture(autouse=True, scope="session")
def _isolated_channel_layer() -> Iterator[None]:
    from channels.layers import channel_layers
    from django.conf import settings

    layer = settings.CHANNEL_LAYERS["default"]
    if "CONFIG" in layer:
        layer["CONFIG"]["prefix"] = os.environ["DAY0_CHANNELS_PREFIX"]
    channel_layers.backends.clear()
    yield


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache() -> Iterator[None]:
    """The run's own cache key prefix (settings were read before this file set it), shared with the servers the
    tests start (they inherit the environment)."""
    from django.conf import settings
    from django.test import override_settings

    caches = {alias: {**config, "KEY_PREFIX": os.environ["DAY0_CACHE_PREFIX"]}
              for alias, config in settings.CACHES.items()}
    with override_settings(CACHES=caches):
        yield


@pytest.fixture(autouse=True)
def _fresh_cache(request: pytest.FixtureRequest, _isolated_cache: None) -> Iterator[None]:
    """After a test that used the database (the cache summarizes its rows), removes this run's cache keys (never
    FLUSHDB: other runs and Celery share the Redis database) or clears the in-memory cache, so the next test
    starts with none of them."""
    yield
    if "_django_db_helper" not in request.fixturenames:
        return
    from django.core.cache import caches

    for cache in caches.all():
        if hasattr(cache, "_cache") and hasattr(cache._cache, "get_client"):  # RedisCache
            client = cache._cache.get_client(write=True)
            keys = list(client.scan_iter(match=f"{cache.key_prefix}:*", count=1000))
            if keys:
                client.delete(*keys)
        else:
            cache.clear()


@pytest.fixture(scope="session")
def db_snapshots() -> Snapshots:
    """``restore_or_build(key, build)``: ``build()``'s rows, built once per session and copied back for each
    caller (``tests/snapshots.py``); call it with the database open (a ``transactional_db`` test, or a module
    fixture inside its own transaction)."""
    return Snapshots()


@pytest.fixture
def api_client() -> APIClient:
    from rest_framework.test import APIClient

    return APIClient()
