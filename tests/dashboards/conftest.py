"""Dashboard tests: route through the project's URL map once it includes the dashboards; until the lead adds
the include lines, through ``tests/dashboards/urls.py`` (the same views, nothing stubbed)."""

from __future__ import annotations

import pytest
from django.urls import Resolver404, resolve


def dashboards_routed() -> bool:
    try:
        return resolve("/trends/").url_name == "trends-page" and (
            resolve("/api/v1/benchmarks/regressions/").url_name == "benchmark-regressions")
    except Resolver404:
        return False


@pytest.fixture(autouse=True)
def _dashboard_urls(settings):  # noqa: ANN001, ANN202
    if not dashboards_routed():
        settings.ROOT_URLCONF = "tests.dashboards.urls"


@pytest.fixture(scope="module")
def world(django_db_setup, django_db_blocker):  # noqa: ANN001, ANN201
    """One seeded world per test module, rolled back at the module's end (each test runs in a savepoint)."""
    from django.db import transaction

    from tests.dashboards.world import build_world

    with django_db_blocker.unblock():
        with transaction.atomic():
            yield build_world()
            transaction.set_rollback(True)


@pytest.fixture
def client_for(client):  # noqa: ANN001, ANN201
    """``client_for(user)``: Django's test client logged in as ``user`` (None: anonymous)."""

    def login(user):  # noqa: ANN001, ANN202
        client.logout()
        if user is not None:
            client.force_login(user)
        return client

    return login
