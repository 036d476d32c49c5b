"""A bounded, seeded schemathesis run over every operation of ``/api/schema/``, through the WSGI application on
the test's PostgreSQL database, with a submitter's token and an agent's: no server error and no response that
breaks its documented schema. The default run is small (a few examples per operation); ``-m slow`` runs a
larger one."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from django.db import transaction
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from apps.accounts.choices import Role
from apps.jobs import services as job_services
from tests.factories import HardwareFactory, JobFactory, ModelReleaseFactory, OrganizationFactory, make_token

pytestmark = pytest.mark.django_db
CHECKS = [not_a_server_error, response_schema_conformance]
DEFAULT_EXAMPLES, SLOW_EXAMPLES = 4, 60


@pytest.fixture
def wsgi_app(db: None) -> Iterator[Any]:
    """The WSGI application on the test's database connection: like Django's test client, requests must not close
    the connection (the test's transaction lives on it)."""
    from django.core.signals import request_finished, request_started
    from django.core.wsgi import get_wsgi_application
    from django.db import close_old_connections

    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield get_wsgi_application()
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


@pytest.fixture
def api_schema(wsgi_app: Any) -> Any:
    return schemathesis.openapi.from_wsgi("/api/schema/?format=json", wsgi_app)


@pytest.fixture
def tokens(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A world with one of each row (so lookups can hit), a submitter-and-admin token and an agent token."""
    monkeypatch.setattr(job_services, "do_dispatch_job", lambda job_id: None)  # no broker round trip per job
    org = OrganizationFactory(slug="vendor")
    hardware = HardwareFactory(organization=org, slug="npu")
    model = ModelReleaseFactory(organization=org, slug="model-1")
    JobFactory(model=model, hardware=hardware, organization=org)
    submitter = make_token(organization=org, role=Role.ADMIN, scopes=["read", "submit"])
    agent = make_token(organization=org, role=Role.ADMIN, scopes=["agent"], hardware=hardware)
    return {"submitter": submitter.secret, "agent": agent.secret}


def _fuzz(api_schema: Any, tokens: dict[str, str], examples: int) -> None:
    """Runs ``examples`` seeded cases of every operation with each token; fails listing every operation that
    answered a 5xx or broke its response schema (not only the first)."""
    failures: list[str] = []
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) >= 30, [op.label for op in operations]
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=examples, derandomize=True, deadline=None, database=None,
                  phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
        def check(case: Any) -> None:
            for secret in tokens.values():
                savepoint = transaction.savepoint()  # each call on the same world (a fuzzed revoke is undone)
                try:
                    case.call_and_validate(headers={"Authorization": f"Token {secret}"}, checks=CHECKS)
                finally:
                    transaction.savepoint_rollback(savepoint)

        try:
            check()
        except (Exception, BaseExceptionGroup) as exc:  # noqa: BLE001 - collected, then reported together
            failures.append(f"{operation.label}: {str(exc)[:1500]}")
    assert not failures, "\n\n".join(failures)


def test_every_operation_answers_within_its_schema_and_never_a_5xx(api_schema, tokens) -> None:
    _fuzz(api_schema, tokens, DEFAULT_EXAMPLES)


@pytest.mark.slow
def test_every_operation_at_length(api_schema, tokens) -> None:
    _fuzz(api_schema, tokens, SLOW_EXAMPLES)
