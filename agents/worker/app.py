"""The agent's Celery app: a worker on an accelerator host consuming the queue ``hw.<hardware-slug>``
(its names: ``contract.queues``).

It loads no Django settings and holds no database credentials: only the broker URL, the portal URL and an
agent token. One job at a time (solo pool, concurrency 1, prefetch 1); acknowledgement after the task ends and
rejection when the worker is lost, so a killed agent's message is delivered again (the task ignores a stale
delivery: the portal's attempt counter decides).

On RabbitMQ (``amqp://``) the agent's broker user may only read its two queues (``manage.py broker_user`` on the
portal creates it and declares the queues): the worker declares nothing, and runs without remote control,
events, gossip, mingle and worker heartbeats, which would need exchanges of their own."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from celery import Celery
from kombu import Exchange, Queue

from agents.worker.agent_state import data_dir as agent_data_dir
from contract.queues import AGENT_DEFAULT_QUEUE, agent_queues


def default_broker_url() -> str:
    """``DAY0_AGENT_BROKER`` (in production: the URL ``manage.py broker_user`` printed for this agent), else
    ``DAY0_REDIS_URL`` (a development host where one Redis is everything), else the embedded filesystem broker."""
    return os.environ.get("DAY0_AGENT_BROKER") or os.environ.get("DAY0_REDIS_URL") or "filesystem://"


def is_amqp(broker_url: str) -> bool:
    return broker_url.split("://", 1)[0] in ("amqp", "amqps", "pyamqp")


def filesystem_options(data_dir: Path | None = None) -> dict:
    """kombu filesystem transport folders shared with the portal (``$DAY0_DATA_DIR/broker``)."""
    root = Path(data_dir) if data_dir else agent_data_dir()
    queue, processed, control = (root / "broker" / sub for sub in ("queue", "processed", "control"))
    for folder in (queue, processed, control):
        folder.mkdir(parents=True, exist_ok=True)
    return {"data_folder_in": str(queue), "data_folder_out": str(queue), "processed_folder": str(processed),
            "control_folder": str(control), "store_processed": False,
            "polling_interval": 0.25}  # the 1 s default slows a stop (SIGTERM) and each job's pickup


def make_app(broker_url: str | None = None) -> Celery:
    broker = broker_url or default_broker_url()
    # agents.worker.tracing: the job's span around each task, connected by signals
    app = Celery("day0agent", broker=broker, include=["agents.worker.tasks", "agents.worker.tracing"])
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        worker_concurrency=1,
        task_default_queue=AGENT_DEFAULT_QUEUE,
        task_track_started=False,
        result_backend=None,
        task_ignore_result=True,
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
        worker_cancel_long_running_tasks_on_connection_loss=False,
        worker_enable_remote_control=False,  # no pidbox exchange: nothing controls an agent through the broker
        worker_send_task_events=False,
        task_send_sent_event=False,
        accept_content=["json"],  # a message is data: nothing from the broker is unpickled
    )
    if broker.startswith("filesystem://"):
        app.conf.broker_transport_options = filesystem_options()
    return app


def consume(app: Celery, hardware_slug: str, agent_id: int) -> list[str]:
    """The queues this agent consumes (its hardware's, and its own for a multi-node job's node), set on ``app``.
    On RabbitMQ they are not declared by the agent (its user may not): the portal declared them."""
    names = list(agent_queues(hardware_slug, agent_id))
    no_declare = is_amqp(app.conf.broker_url or "")
    app.conf.task_queues = [Queue(n, Exchange(n), routing_key=n, no_declare=no_declare) for n in names]
    return names


def worker_argv(queues: list[str], nodename: str, loglevel: str = "INFO") -> list[str]:
    """``celery worker`` arguments of an agent: one job at a time, and no broker feature beyond its queues."""
    return ["worker", "-Q", ",".join(queues), "--pool", "solo", "--concurrency", "1", "--prefetch-multiplier", "1",
            "-n", nodename, "--loglevel", loglevel, "--without-gossip", "--without-mingle", "--without-heartbeat"]


def run_worker(app: Celery, argv: list[str]) -> int:
    """Runs ``celery worker`` with ``argv`` and returns its exit status (``worker_main`` drops it): a worker the
    broker refused (a queue its user may not read) ends with 1, so a restart policy sees the failure."""
    from celery.signals import celeryd_init

    started: list[Any] = []

    def keep(sender: Any = None, instance: Any = None, **_: Any) -> None:
        started.append(instance)

    celeryd_init.connect(keep, weak=False)
    try:
        app.worker_main(argv)
    finally:
        celeryd_init.disconnect(keep)
    return int(started[-1].exitcode or 0) if started else 1


app = make_app()
