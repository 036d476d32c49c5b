"""Health probes, the body-size limit, the API schema and docs."""

from __future__ import annotations

import pytest

from tests.factories import OrganizationFactory, auth, make_token

pytestmark = pytest.mark.django_db


def test_healthz_and_readyz(client) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["checks"] == {"database": "ok", "broker": "ok"}


def test_readyz_is_503_when_the_broker_is_unreachable(client, settings) -> None:
    settings.REDIS_URL = settings.CELERY_BROKER_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["checks"]["broker"] == "fail" and "redis" in response.json()["errors"]["broker"]


def test_readyz_checks_the_filesystem_broker_folder(client, settings, tmp_path) -> None:
    settings.REDIS_URL = ""
    settings.CELERY_BROKER_URL = "filesystem://"
    settings.CELERY_BROKER_TRANSPORT_OPTIONS = {"data_folder_in": str(tmp_path / "absent")}
    assert client.get("/readyz").status_code == 503
    (tmp_path / "absent").mkdir()
    assert client.get("/readyz").status_code == 200


def test_oversized_bodies_are_refused_with_413(api_client, settings) -> None:
    settings.MAX_BODY_BYTES = 2048
    token = make_token(organization=OrganizationFactory())
    response = api_client.post("/api/v1/models/", {"slug": "x", "config": {"pad": "x" * 4096}}, format="json",
                               **auth(token))
    assert response.status_code == 413 and "2048" in response.json()["detail"]


def test_schema_and_docs_are_served(client) -> None:
    schema = client.get("/api/schema/")
    assert schema.status_code == 200
    text = schema.content.decode()
    for path in ("/api/v1/models/", "/api/v1/jobs/{id}/events/", "/api/v1/jobs/{id}/results/", "/api/v1/matrix/",
                 "/api/v1/agents/"):
        assert path in text, path
    docs = client.get("/api/docs/")
    assert docs.status_code == 200 and b"swagger" in docs.content.lower()


def test_readyz_checks_rabbitmq_and_the_cache_redis_apart(client, settings) -> None:
    """Production: RabbitMQ is the broker, and the cache and channel layer's Redis is checked on its own."""
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    settings.CELERY_BROKER_URL = "amqp://guest:guest@127.0.0.1:1//"
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["checks"] == {"database": "ok", "broker": "fail", "redis": "fail"}
    assert "broker unreachable" in response.json()["errors"]["broker"]
