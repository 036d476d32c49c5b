"""Dashboard test fixtures: a seeded world per module, and a logged-in test client."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def world(django_db_setup, django_db_blocker, db_snapshots):  # noqa: ANN001, ANN201
    """One seeded world per test module, rolled back at the module's end (each test runs in a savepoint); built
    once per session and copied back (the browser tests' world is the same)."""
    from django.contrib.contenttypes.models import ContentType
    from django.db import transaction

    from tests.dashboards.world import build_world

    with django_db_blocker.unblock():
        with transaction.atomic():
            yield db_snapshots.restore_or_build("dashboards_world", build_world)
            transaction.set_rollback(True)
        ContentType.objects.clear_cache()  # the copy's content type ids were rolled back


@pytest.fixture
def client_for(client):  # noqa: ANN001, ANN201
    """``client_for(user)``: Django's test client logged in as ``user`` (None: anonymous)."""

    def login(user):  # noqa: ANN001, ANN202
        client.logout()
        if user is not None:
            client.force_login(user)
        return client

    return login
