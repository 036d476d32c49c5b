"""The portal's ``/metrics``: only for staff or the metrics token; jobs, queues, agents and refusals as an
operator's Prometheus reads them."""

from __future__ import annotations

import shutil
import subprocess
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.test import override_settings
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from apps.fleet.models import Agent
from apps.ops import store
from tests.factories import HardwareFactory, JobFactory, OrganizationFactory, UserFactory, auth, make_token
from tests.portal.reports import bound, passing

pytestmark = pytest.mark.django_db
TOKEN = "scrape-me-0123456789"


def scrape(client: Any, **headers: str) -> dict[tuple[str, frozenset], float]:
    response = client.get("/metrics", **headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(response.content.decode()) for s in family.samples}


def bearer(token: str) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Bearer {token}"}


@override_settings(METRICS_TOKEN=TOKEN)
def test_metrics_are_refused_without_the_token_or_a_staff_session(client) -> None:
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", **bearer("wrong-token")).status_code == 401
    client.force_login(UserFactory(is_staff=False))
    assert client.get("/metrics").status_code == 403
    assert client.get("/metrics", **bearer(TOKEN)).status_code == 200
    client.force_login(UserFactory(is_staff=True))
    assert client.get("/metrics").status_code == 200


@override_settings(METRICS_TOKEN="")
def test_an_empty_token_setting_opens_nothing(client) -> None:
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer ").status_code == 401


@override_settings(METRICS_TOKEN=TOKEN)
def test_jobs_agents_and_stuck_jobs_by_hardware(client) -> None:
    # a slug no other test has published to: the broker's queue hw.<slug> outlives each test's database
    hw = HardwareFactory(slug=f"ops-{uuid.uuid4().hex[:12]}")
    now = timezone.now()
    JobFactory(hardware=hw, state="queued")
    JobFactory(hardware=hw, state="dispatched", dispatched_at=now - timedelta(hours=1))  # unclaimed for an hour
    silent = Agent.objects.create(hardware=hw, hostname="silent", last_heartbeat_at=now - timedelta(hours=1))
    Agent.objects.create(hardware=hw, hostname="alive", last_heartbeat_at=now - timedelta(seconds=5))
    JobFactory(hardware=hw, state="running", agent=silent)
    found = scrape(client, **bearer(TOKEN))

    def value(name: str, **labels: str) -> float | None:
        return found.get((name, frozenset(labels.items())))

    assert value("day0_portal_jobs", state="queued", hardware=hw.slug) == 1
    assert value("day0_portal_jobs", state="running", hardware=hw.slug) == 1
    assert value("day0_portal_jobs_waiting", hardware=hw.slug) == 2
    assert value("day0_portal_jobs_stuck", hardware=hw.slug, reason="unclaimed") == 1
    assert value("day0_portal_jobs_stuck", hardware=hw.slug, reason="agent_silent") == 1
    assert value("day0_portal_agents", hardware=hw.slug) == 2
    assert value("day0_portal_agents_online", hardware=hw.slug) == 1
    age = value("day0_portal_agent_heartbeat_age_seconds", hardware=hw.slug, agent=f"{silent.pk}:silent")
    assert 3590 < age < 3700
    # the test broker (Redis) answers: nothing was published in this transaction, so the queue is empty
    assert value("day0_portal_broker_up") == 1
    assert value("day0_portal_queue_depth", hardware=hw.slug, source="broker") == 0


@override_settings(METRICS_TOKEN=TOKEN, CELERY_BROKER_URL="amqp://nobody:nothing@127.0.0.1:1//")
def test_queue_depth_falls_back_to_the_database_when_the_broker_is_unreachable(client) -> None:
    hw = HardwareFactory()
    JobFactory(hardware=hw, state="queued")
    JobFactory(hardware=hw, state="dispatched", dispatched_at=timezone.now())
    found = scrape(client, **bearer(TOKEN))
    assert found[("day0_portal_broker_up", frozenset())] == 0
    assert found[("day0_portal_queue_depth", frozenset({"hardware": hw.slug, "source": "database"}.items()))] == 2


@override_settings(METRICS_TOKEN=TOKEN)
def test_refused_results_are_counted_by_reason(client, api_client) -> None:
    hardware = HardwareFactory()
    job = JobFactory(hardware=hardware, spec={"stages": ["plan"], "dtype": "bfloat16"})
    token = make_token(organization=OrganizationFactory(), scopes=["agent"], hardware=hardware)
    before = store.read_counter("results_refused")
    doc = bound(job, {"stage": "plan", "section": passing("plan")})
    for refused in ({k: v for k, v in doc.items() if k != "nonce"}, {**doc, "nonce": "0" * 32},
                    {**doc, "attempt": 2}):
        response = api_client.post(f"/api/v1/jobs/{job.pk}/results/", refused, format="json", **auth(token))
        assert 400 <= response.status_code < 500
    moved = {k: v - before.get(k, 0) for k, v in store.read_counter("results_refused").items()}
    assert moved == {("invalid_nonce", "400"): 1, ("wrong_nonce", "409"): 1, ("superseded_attempt", "409"): 1}
    found = scrape(client, **bearer(TOKEN))
    assert found[("day0_portal_results_refused_total", frozenset({"reason": "wrong_nonce", "status": "409"}.items()))] \
        == store.read_counter("results_refused")[("wrong_nonce", "409")]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian's prometheus package) not installed")
@override_settings(METRICS_TOKEN=TOKEN)
def test_promtool_accepts_the_portal_exposition(client) -> None:
    JobFactory(state="queued")
    text = client.get("/metrics", **bearer(TOKEN)).content.decode()
    done = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.django_db(transaction=True)
def test_websocket_connections_are_counted_open_and_closed() -> None:
    import asyncio

    from channels.testing import WebsocketCommunicator

    from day0portal.asgi import application

    token = make_token(organization=OrganizationFactory())
    open_now = lambda: store.read_counter("websocket_connections").get(("matrix",), 0)  # noqa: E731
    before, opened = open_now(), store.read_counter("websocket_opened").get(("matrix",), 0)

    async def session() -> float:
        comm = WebsocketCommunicator(application, f"/ws/matrix/?token={token.secret}",
                                     headers=[(b"origin", b"http://localhost"), (b"host", b"localhost")])
        connected, _ = await comm.connect()
        assert connected
        during = await asyncio.to_thread(open_now)
        await comm.disconnect()
        return during

    assert asyncio.run(session()) == before + 1
    assert open_now() == before
    assert store.read_counter("websocket_opened").get(("matrix",), 0) == opened + 1


def test_a_portal_task_run_is_counted_with_its_time() -> None:
    from apps.jobs.tasks import detect_lost_jobs_task

    key = ("jobs.detect_lost_jobs", "success")
    before = store.read_counter("celery_tasks").get(key, 0)
    timed = store.read_histogram("celery_task_seconds", store.TASK_BUCKETS).get(("jobs.detect_lost_jobs",))
    detect_lost_jobs_task.apply()  # run here, through Celery's tracer: its prerun and postrun signals fire
    assert store.read_counter("celery_tasks")[key] == before + 1
    after = store.read_histogram("celery_task_seconds", store.TASK_BUCKETS)[("jobs.detect_lost_jobs",)]
    assert after["count"] == (timed["count"] if timed else 0) + 1
