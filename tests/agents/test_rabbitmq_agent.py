"""The production broker end to end: a portal publishing to RabbitMQ, and ``day0 agent`` connected with the
broker user ``manage.py broker_user`` made for it (it may read its own two queues and nothing else) runs a job
from POST to succeeded."""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from django.core.management import call_command

from agents.runtime.testing.make_model import cached_model
from apps.accounts.choices import Scope
from apps.jobs.models import Job
from tests.agents.conftest import PortalProcess, model_config, unique_slug, wait_for
from tests.factories import HardwareFactory, ModelReleaseFactory, OrganizationFactory, make_token
from tests.rabbit import rabbitmq_vhost

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def _rabbit_portal_server(django_db_setup) -> Iterator[tuple[PortalProcess, dict]]:
    with rabbitmq_vhost() as broker, pytest.MonkeyPatch.context() as env:
        env.setenv("DAY0_BROKER_URL", broker["portal_url"])
        server = PortalProcess()
        server.start()
        try:
            yield server, broker
        finally:
            server.stop()


@pytest.fixture
def rabbit_portal(_rabbit_portal_server, settings) -> tuple[PortalProcess, dict]:
    """A portal whose Celery broker is this run's RabbitMQ virtual host (its cache and channel layer stay on the
    suite's Redis); this process's settings point ``manage.py broker_user`` at the same broker."""
    settings.CELERY_BROKER_URL = _rabbit_portal_server[1]["portal_url"]
    settings.BROKER_ADMIN_URL = ""
    return _rabbit_portal_server


def test_an_agent_with_its_own_broker_user_runs_a_job(rabbit_portal, start_agent, tmp_path: Path) -> None:
    portal, broker = rabbit_portal
    model_dir = cached_model("qwen3-moe")
    org = OrganizationFactory(slug=unique_slug("org"))
    model = ModelReleaseFactory(slug=unique_slug("tiny-moe"), organization=org, config=model_config(model_dir))
    hardware = HardwareFactory(slug=unique_slug("hw"), memory_bytes=8 * 10**9, devices_per_node=1,
                               dtypes=["float32", "bfloat16"])
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / model.slug).symlink_to(model_dir)
    submit = make_token(organization=org)
    token = make_token(organization=org, scopes=[Scope.AGENT], hardware=hardware, name="agent")

    out, err = io.StringIO(), io.StringIO()
    call_command("broker_user", hardware=hardware.slug, hostname="rabbit-host", stdout=out, stderr=err)
    broker_url = out.getvalue().strip()
    broker["users"].append(err.getvalue().split()[2])  # "broker user agent-<id>-<slug> (created) …"
    assert broker_url.startswith("amqp://agent-") and broker["portal_url"].split("@")[0] not in broker_url

    response = httpx.post(f"{portal.url}/api/v1/jobs/", headers={"Authorization": f"Token {submit.secret}"},
                          json={"model": model.slug, "hardware": hardware.slug, "stages": ["plan"],
                                "dtype": "float32"}, timeout=30)
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]
    agent = start_agent(hardware.slug, token.secret, models_dir=tmp_path / "models", hostname="rabbit-host",
                        broker=broker_url, portal_url=portal.url)
    wait_for(lambda: Job.objects.get(pk=job_id).state == "succeeded", 120, f"job {job_id} to succeed", agent)
    log = agent.log()
    assert "ACCESS_REFUSED" not in log and "agent." in log, log


def test_an_agent_without_a_broker_user_of_its_own_is_refused_and_exits(rabbit_portal, start_agent) -> None:
    """Another host given that URL registers as another agent: its own queue is not the user's to read, and
    ``day0 agent`` exits non-zero naming the refusal (a restart policy sees a failure)."""
    portal, broker = rabbit_portal
    org = OrganizationFactory(slug=unique_slug("org"))
    hardware = HardwareFactory(slug=unique_slug("hw"))
    token = make_token(organization=org, scopes=[Scope.AGENT], hardware=hardware, name="agent")
    out, err = io.StringIO(), io.StringIO()
    call_command("broker_user", hardware=hardware.slug, hostname="granted-host", stdout=out, stderr=err)
    broker["users"].append(err.getvalue().split()[2])
    agent = start_agent(hardware.slug, token.secret, hostname="other-host", broker=out.getvalue().strip(),
                        portal_url=portal.url)
    assert agent.proc.wait(timeout=60) != 0, agent.log()
    assert re.search(r"ACCESS_REFUSED - access to queue 'agent\.\d+'|NOT_FOUND - no queue 'agent\.\d+'",
                     agent.log()), agent.log()
