"""A RabbitMQ virtual host of one test run on the broker at 127.0.0.1:5672, with a portal (publisher) user; the
virtual host and every user listed in ``users`` are deleted at the end. Skips, saying why, where the broker or
``rabbitmqctl`` cannot be used (``.ci/services.sh`` starts the broker)."""

from __future__ import annotations

import os
import secrets
import shutil
import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import pytest

from day0portal import rabbitmq


@contextmanager
def rabbitmq_vhost() -> Iterator[dict[str, Any]]:
    try:
        socket.create_connection(("127.0.0.1", 5672), timeout=2).close()
    except OSError:
        pytest.skip("RabbitMQ is not listening on 127.0.0.1:5672 (.ci/services.sh starts it)")
    if shutil.which("rabbitmqctl") is None:
        pytest.skip("rabbitmqctl is not installed")
    ctl = rabbitmq.Rabbitmqctl()
    run = f"day0-test-{os.getpid()}-{secrets.token_hex(3)}"
    try:
        ctl.add_vhost(run)
    except rabbitmq.BrokerAdminError as exc:
        pytest.skip(f"rabbitmqctl cannot manage the broker here (run the tests as root): {exc}")
    portal_user, portal_password = f"{run}-portal", rabbitmq.new_password()
    made_users = [portal_user]
    try:
        ctl.put_user(portal_user, portal_password)
        ctl.set_permissions(run, portal_user, rabbitmq.Grant(".*", ".*", ".*"))
        yield {"vhost": run, "portal_url": f"amqp://{portal_user}:{portal_password}@127.0.0.1:5672/{run}",
               "users": made_users}
    finally:
        with ThreadPoolExecutor(4) as pool:  # each rabbitmqctl call boots an Erlang VM (~0.5 s)
            list(pool.map(ctl.delete_user, set(made_users)))
        ctl.delete_vhost(run)  # its queues, exchanges and permissions go with it
