"""Agents outside the portal's trust domain, against the real RabbitMQ on 127.0.0.1:5672: ``manage.py
broker_user`` gives each agent a user that reads its own queues and nothing else. Each run works in a virtual
host of its own, deleted at the end with every user the run made."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from contract.queues import RUN_JOB_TASK
from day0portal import rabbitmq
from tests.factories import HardwareFactory
from tests.rabbit import rabbitmq_vhost

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
JOB_TASK = RUN_JOB_TASK


@pytest.fixture(scope="module")
def broker_vhost() -> Iterator[dict[str, Any]]:
    with rabbitmq_vhost() as made:
        yield made


@pytest.fixture
def broker(broker_vhost: dict[str, Any], settings) -> dict[str, Any]:
    """The portal's settings point at this run's virtual host, with ``rabbitmqctl`` as the admin tool."""
    settings.CELERY_BROKER_URL = broker_vhost["portal_url"]
    settings.BROKER_ADMIN_URL = ""
    return broker_vhost


def _agent_url(broker: dict[str, Any], hardware: str, hostname: str) -> tuple[str, int]:
    from apps.fleet.models import Agent

    out, err = io.StringIO(), io.StringIO()
    call_command("broker_user", hardware=hardware, hostname=hostname, stdout=out, stderr=err)
    agent = Agent.objects.get(hardware__slug=hardware, hostname=hostname)
    broker["users"].append(rabbitmq.agent_username(agent.pk, hardware))
    assert f"hw.{hardware}, agent.{agent.pk} only" in err.getvalue()
    return out.getvalue().strip(), agent.pk


def _connect(url: str) -> Any:
    from kombu import Connection

    conn = Connection(url, connect_timeout=5)
    conn.connect()
    return conn


def _refused(url: str, action: Callable[[Any], Any]) -> str:
    """Runs ``action`` on a fresh channel of ``url``'s user and returns the broker's refusal."""
    from amqp.exceptions import AccessRefused

    with _connect(url) as conn:
        channel = conn.connection.channel()
        with pytest.raises(AccessRefused) as refused:
            action(channel)
            channel.basic_qos(0, 1, False)  # a synchronous call: a refused publish closes the channel by then
        return str(refused.value)


def _publish(portal_url: str, queue: str, args: list[Any], task: str = JOB_TASK) -> None:
    """As ``apps.jobs.dispatch.send_job`` publishes a job, with the portal's user."""
    from day0portal.celery import app

    with app.connection_for_write(portal_url) as conn:
        app.send_task(task, args=args, queue=queue, routing_key=queue, connection=conn)


def test_an_agent_user_reads_its_own_queue_and_nothing_else(broker) -> None:
    a, b = HardwareFactory(slug=f"{broker['vhost']}-a"), HardwareFactory(slug=f"{broker['vhost']}-b")
    url_a, agent_a = _agent_url(broker, a.slug, "host-a")
    url_b, agent_b = _agent_url(broker, b.slug, "host-b")
    assert url_b.startswith(f"amqp://agent-{agent_b}-{b.slug}:") and url_b.endswith(f"@127.0.0.1:5672/{broker['vhost']}")
    embargoed = {"model": {"slug": "secret-model", "config": {"hidden_size": 7168}}}
    _publish(broker["portal_url"], f"hw.{a.slug}", [1, embargoed])
    _publish(broker["portal_url"], f"hw.{b.slug}", [2, {"model": {"slug": "b-model"}}])

    with _connect(url_b) as conn:  # B consumes its own hardware's queue
        message = conn.connection.channel().basic_get(queue=f"hw.{b.slug}", no_ack=False)
        assert message is not None and "b-model" in str(message.body)
        message.channel.basic_reject(message.delivery_tag, requeue=True)

    hw_a, hw_b = f"hw.{a.slug}", f"hw.{b.slug}"
    for what, action in {
        "read A's job": lambda ch: ch.basic_get(queue=hw_a),
        "consume A's queue": lambda ch: ch.basic_consume(queue=hw_a, callback=lambda m: None),
        "purge A's queue": lambda ch: ch.queue_purge(queue=hw_a),
        "delete A's queue": lambda ch: ch.queue_delete(queue=hw_a),
        "redeclare A's queue": lambda ch: ch.queue_declare(queue=hw_a, durable=True, auto_delete=False),
        "declare a queue": lambda ch: ch.queue_declare(queue="b-tap", durable=False, auto_delete=True),
        "bind its queue to A's exchange": lambda ch: ch.queue_bind(queue=hw_b, exchange=hw_a, routing_key=hw_a),
        "read A's node queue": lambda ch: ch.basic_get(queue=f"agent.{agent_a}"),
        "publish a job to A": lambda ch: ch.basic_publish(_message(), exchange="", routing_key=hw_a),
        "publish to A's exchange": lambda ch: ch.basic_publish(_message(), exchange=hw_a, routing_key=hw_a),
        "publish to its own exchange": lambda ch: ch.basic_publish(_message(), exchange=hw_b, routing_key=hw_b),
        "publish a portal task": lambda ch: ch.basic_publish(_message(), exchange="", routing_key="portal"),
        "declare celery's control exchange": lambda ch: ch.exchange_declare("celery.pidbox", "fanout"),
    }.items():
        assert "ACCESS_REFUSED" in _refused(url_b, action), what

    with _connect(broker["portal_url"]) as conn:  # A's job is still there, unread
        assert conn.connection.channel().queue_declare(queue=hw_a, passive=True).message_count == 1

    from amqp.exceptions import AccessRefused

    rotated, same_agent = _agent_url(broker, b.slug, "host-b")  # running it again rotates the password
    assert same_agent == agent_b and rotated != url_b
    with pytest.raises(AccessRefused):
        _connect(url_b)
    _connect(rotated).release()


def _message() -> Any:
    from amqp import Message

    return Message(b'{"forged": true}', content_type="application/json")


WORKER = """
import sys
from pathlib import Path
from agents.worker.app import consume, make_app, worker_argv

app = make_app(sys.argv[1])

@app.task(name="day0.test_probe")
def probe(path):
    Path(path).write_text("ran")

queues = consume(app, sys.argv[2], int(sys.argv[3]))
app.worker_main(worker_argv(queues, "agent-probe@test", "INFO"))
"""


def test_a_celery_worker_with_the_agents_url_consumes_its_tasks(broker, tmp_path) -> None:
    """The agent's own Celery configuration (no declares, no remote control, no events) runs on a user that
    may only read its two queues."""
    a = HardwareFactory(slug=f"{broker['vhost']}-w")
    url_a, agent_a = _agent_url(broker, a.slug, "host-a")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DAY0_", "DJANGO_"))}
    env["PYTHONPATH"] = str(ROOT)
    log = tmp_path / "worker.log"
    worker = subprocess.Popen([sys.executable, "-c", WORKER, url_a, a.slug, str(agent_a)], cwd=ROOT, env=env,
                              stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        for queue in (f"hw.{a.slug}", f"agent.{agent_a}"):
            _publish(broker["portal_url"], queue, [str(tmp_path / queue)], task="day0.test_probe")
        deadline = time.monotonic() + 60
        while not all((tmp_path / q).exists() for q in (f"hw.{a.slug}", f"agent.{agent_a}")):
            assert worker.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)
    finally:  # a warm shutdown on py-amqp takes seconds; the agent's own stop is tested with its lifecycle
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()
    assert "ACCESS_REFUSED" not in log.read_text()


def test_broker_user_refusals_name_what_was_wrong(settings) -> None:
    from django.core.management.base import CommandError

    from apps.fleet.models import Agent

    a, b = HardwareFactory(), HardwareFactory()
    other = Agent.objects.create(hardware=b, hostname="elsewhere")
    amqp, redis = "amqp://day0:pw@127.0.0.1:1/day0", "redis://127.0.0.1:6379/0"  # nothing is reached: refused first
    for broker, kwargs, message in (
            (amqp, {"hardware": "no-such-hw", "hostname": "h"}, "no hardware 'no-such-hw'"),
            (amqp, {"hardware": a.slug, "agent_id": other.pk}, f"no agent {other.pk} on {a.slug}"),
            (amqp, {"hardware": a.slug, "hostname": " "}, "--hostname must be 1 to 255 characters"),
            (redis, {"hardware": a.slug, "hostname": "h"}, r"broker users need RabbitMQ .* redis://")):
        settings.CELERY_BROKER_URL = broker
        with pytest.raises(CommandError, match=message):
            call_command("broker_user", stdout=io.StringIO(), stderr=io.StringIO(), **kwargs)
    assert not Agent.objects.filter(hardware=a).exists()  # nothing registered for a refused call


def test_agent_broker_urls_keep_the_virtual_host_and_take_another_address() -> None:
    url = rabbitmq.agent_broker_url("amqp://day0:secret@rabbitmq:5672/day0", "agent-3-h100", "p/w", "mq.example:5671")
    assert url == "amqp://agent-3-h100:p%2Fw@mq.example:5671/day0"
    assert rabbitmq.agent_broker_url("amqp://u:p@host//", "a", "b").endswith("@host:5672/%2F")
    assert rabbitmq.agent_grant(["hw.a-1", "agent.7"]) == rabbitmq.Grant("^$", "^$", r"^(agent\.7|hw\.a\-1)$")


def test_the_management_api_makes_rotates_and_deletes_agent_users(broker, settings) -> None:
    """docker compose's way (``DAY0_BROKER_ADMIN_URL``): the same user and permissions through RabbitMQ's HTTP API."""
    import httpx
    from amqp.exceptions import AccessRefused

    api = "http://127.0.0.1:15672"
    try:
        httpx.get(f"{api}/api/overview", timeout=2)
    except httpx.HTTPError:
        pytest.skip("RabbitMQ's management API is off (.ci/services.sh enables rabbitmq_management)")
    portal_user, password = broker["portal_url"].split("//", 1)[1].split("@", 1)[0].split(":", 1)
    subprocess.run(["rabbitmqctl", "-q", "set_user_tags", portal_user, "administrator"], check=True, timeout=60)
    settings.BROKER_ADMIN_URL = f"http://{portal_user}:{password}@127.0.0.1:15672"
    a, b = HardwareFactory(slug=f"{broker['vhost']}-ma"), HardwareFactory(slug=f"{broker['vhost']}-mb")
    _publish(broker["portal_url"], f"hw.{b.slug}", [3, {}])
    url, agent = _agent_url(broker, a.slug, "api-host")
    with _connect(url) as conn:
        assert conn.connection.channel().basic_get(queue=f"hw.{a.slug}") is None  # declared, empty, readable
    assert "ACCESS_REFUSED" in _refused(url, lambda ch: ch.basic_get(queue=f"hw.{b.slug}"))
    assert "ACCESS_REFUSED" in _refused(url, lambda ch: ch.queue_purge(queue=f"hw.{b.slug}"))
    rotated, _ = _agent_url(broker, a.slug, "api-host")
    with pytest.raises(AccessRefused):
        _connect(url)
    call_command("broker_user", hardware=a.slug, agent_id=agent, delete=True, stdout=io.StringIO(),
                 stderr=io.StringIO())
    with pytest.raises(AccessRefused):
        _connect(rotated)
