"""Rows built once per session and copied back for every test (or module) that asks for them.

Building the dashboards' world through the portal's services takes seconds (a few thousand queries: job
transitions, ingest, verdicts, cell recomputation); copying the resulting rows back takes milliseconds.
``restore_or_build(key, build)`` runs ``build()`` the first time in a session and reads every non-empty table
into memory with PostgreSQL's binary ``COPY``; later calls replace those tables' rows with the copy (content types
and permissions included, so their ids are the copy's) and hand back a deep copy of what ``build()`` returned, so
no caller sees another's in-memory changes. It works the same inside a transaction that is rolled back later (a
module's world) and in a transactional test (the browser tests, whose server is another process), so both share
one build. Sequences only move forward: a row a test creates never takes an id an earlier test used.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, TypeVar

from django.db import connection, transaction

T = TypeVar("T")


class Snapshots:
    """Per session: key -> ({table: its rows in COPY binary format}, what ``build()`` returned)."""

    def __init__(self) -> None:
        self.taken: dict[str, tuple[dict[str, bytes], Any]] = {}

    def restore_or_build(self, key: str, build: Callable[[], T]) -> T:
        if key not in self.taken:
            built = build()
            self.taken[key] = (_take(), built)
        else:
            _restore(self.taken[key][0])
        return copy.deepcopy(self.taken[key][1])


def _take() -> dict[str, bytes]:
    q = connection.ops.quote_name
    rows: dict[str, bytes] = {}
    with transaction.atomic(), connection.cursor() as cursor:
        for table in sorted(connection.introspection.django_table_names(only_existing=True, include_views=False)):
            cursor.execute(f"SELECT EXISTS (SELECT 1 FROM {q(table)})")
            if cursor.fetchone()[0]:
                with cursor.copy(f"COPY {q(table)} TO STDOUT (FORMAT binary)") as out:
                    rows[table] = b"".join(bytes(chunk) for chunk in out)
    return rows


def _restore(rows: dict[str, bytes]) -> None:
    from django.contrib.contenttypes.models import ContentType

    q = connection.ops.quote_name
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL DEFERRED")  # Django's foreign keys are deferrable: any order
        for table in rows:
            cursor.execute(f"DELETE FROM {q(table)}")
        for table, data in rows.items():
            with cursor.copy(f"COPY {q(table)} FROM STDIN (FORMAT binary)") as into:
                into.write(data)
            for sequence in connection.introspection.get_sequences(cursor, table):
                # past both the copy's ids and every id handed out so far (nextval moves it by one)
                cursor.execute(
                    f"SELECT setval(%s::regclass, GREATEST(nextval(%s::regclass), (SELECT COALESCE(MAX("
                    f"{q(sequence['column'])}), 0) FROM {q(table)})))", [sequence["name"], sequence["name"]])
    ContentType.objects.clear_cache()  # the copy's content type ids, not those post_migrate made
