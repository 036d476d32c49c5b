"""Rows built once per session and copied back for every test that asks for them.

A browser test needs committed rows (the portal server is another process), so it runs as a transactional test,
which starts on empty tables and is emptied at teardown. Building the dashboards' world through the portal's
services takes seconds (a few thousand queries: job transitions, ingest, verdicts, cell recomputation); copying
the resulting rows back takes milliseconds. ``restore_or_build(key, build)`` runs ``build()`` the first time in a
session, then copies every non-empty table into the schema ``day0_snapshot_<key>`` of the test database; later
calls replace the tables' rows with that copy (the tables the copy has are emptied first, so content types and
permissions keep the copy's ids) and hand back a deep copy of what ``build()`` returned, so no test sees another's
in-memory changes. Sequences only move forward: a row a test creates never takes an id an earlier test used.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any, TypeVar

from django.db import connection, transaction

T = TypeVar("T")
KEY = re.compile(r"^[a-z0-9_]{1,40}$")


class Snapshots:
    """Per session: key -> (the tables copied, what ``build()`` returned)."""

    def __init__(self) -> None:
        self.taken: dict[str, tuple[list[str], Any]] = {}

    def restore_or_build(self, key: str, build: Callable[[], T]) -> T:
        if not KEY.match(key):
            raise ValueError(f"snapshot key {key!r} must match {KEY.pattern}")
        if key not in self.taken:
            built = build()
            self.taken[key] = (self._take(key), built)
            return copy.deepcopy(built)
        tables, built = self.taken[key]
        self._restore(key, tables)
        return copy.deepcopy(built)

    def drop_all(self) -> None:
        with connection.cursor() as cursor:
            for key in self.taken:
                cursor.execute(f"DROP SCHEMA IF EXISTS {_schema(key)} CASCADE")
        self.taken.clear()

    @staticmethod
    def _take(key: str) -> list[str]:
        schema, q = _schema(key), connection.ops.quote_name
        tables = connection.introspection.django_table_names(only_existing=True, include_views=False)
        copied = []
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")  # a kept test database (--reuse-db)
            cursor.execute(f"CREATE SCHEMA {schema}")
            for table in sorted(tables):
                cursor.execute(f"SELECT EXISTS (SELECT 1 FROM {q(table)})")
                if cursor.fetchone()[0]:
                    cursor.execute(f"CREATE TABLE {schema}.{q(table)} AS TABLE {q(table)}")
                    copied.append(table)
        return copied

    @staticmethod
    def _restore(key: str, tables: list[str]) -> None:
        from django.contrib.contenttypes.models import ContentType

        schema, q = _schema(key), connection.ops.quote_name
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET CONSTRAINTS ALL DEFERRED")
            for table in tables:
                cursor.execute(f"DELETE FROM {q(table)}")
            for table in tables:
                cursor.execute(f"INSERT INTO {q(table)} SELECT * FROM {schema}.{q(table)}")
                for sequence in connection.introspection.get_sequences(cursor, table):
                    # past both the copy's ids and every id handed out so far (nextval moves it by one)
                    cursor.execute(
                        f"SELECT setval(%s::regclass, GREATEST(nextval(%s::regclass), (SELECT COALESCE(MAX({q(sequence['column'])}), 0)"
                        f" FROM {q(table)})))", [sequence["name"], sequence["name"]])
        ContentType.objects.clear_cache()  # the copy's content type ids, not those post_migrate made


def _schema(key: str) -> str:
    return f"day0_snapshot_{key}"
