"""Broker users of agents on RabbitMQ: one user per agent, allowed to read its own two queues and nothing else.

An agent consumes ``hw.<hardware>`` and ``agent.<id>`` (a multi-node job's node; ``contract.queues``). Its user gets, on the portal's
virtual host, configure ``^$`` (it declares, deletes and binds nothing), write ``^$`` (it publishes nothing, and
binds nothing) and read on exactly those two queues (consume, get and purge need read). The portal declares the
queues when it creates the user, as its publisher would, so the agent never has to. Users are managed with
``rabbitmqctl`` on the broker's host, or through the management plugin's HTTP API (``DAY0_BROKER_ADMIN_URL``).

No Django here: ``manage.py broker_user`` resolves the hardware and the agent, then calls this module."""

from __future__ import annotations

import re
import secrets
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote

from kombu.utils.url import parse_url

from contract.queues import agent_queues

AMQP_SCHEMES = ("amqp", "amqps", "pyamqp")
NOTHING = "^$"  # matches no exchange or queue name (the default exchange is checked as "amq.default")


class BrokerAdminError(RuntimeError):
    """The broker refused or could not be reached; the message says which user or call."""


@dataclass(frozen=True)
class Grant:
    """RabbitMQ permissions of one user on one virtual host: regexes over exchange and queue names."""

    configure: str
    write: str
    read: str


def agent_username(agent_id: int, hardware_slug: str) -> str:
    """``agent-<id>-<hardware>``: users are global to the broker, the hardware keeps two portals' (or two test
    runs') agent 1 apart and tells an operator whose user it is."""
    return f"agent-{agent_id}-{hardware_slug}"


def agent_grant(queues: Iterable[str]) -> Grant:
    """Read on ``queues`` exactly; no configure, no write."""
    names = sorted(set(queues))
    if not names:
        raise ValueError("an agent user needs at least one queue")
    return Grant(configure=NOTHING, write=NOTHING, read="^(" + "|".join(re.escape(n) for n in names) + ")$")


def new_password() -> str:
    return secrets.token_urlsafe(24)


def broker_parts(broker_url: str) -> dict[str, Any]:
    """Scheme, host, port and virtual host of an AMQP URL; a clear error for any other broker."""
    scheme = broker_url.split("://", 1)[0] if "://" in broker_url else ""
    if scheme not in AMQP_SCHEMES:
        raise BrokerAdminError(f"broker users need RabbitMQ (amqp://…); the portal's broker is "
                               f"{scheme + '://…' if scheme else repr(broker_url)} (set DAY0_BROKER_URL)")
    parts = parse_url(broker_url)
    return {"scheme": scheme, "host": parts.get("hostname") or "localhost", "port": parts.get("port") or 5672,
            "vhost": parts.get("virtual_host") or "/"}


def agent_broker_url(broker_url: str, username: str, password: str, address: str | None = None) -> str:
    """The portal's broker URL with the agent's user instead of the portal's; ``address`` (``host[:port]``)
    where agents reach the broker under another name than the portal does."""
    parts = broker_parts(broker_url)
    host, port = parts["host"], parts["port"]
    if address:
        host, _, given = address.rpartition(":") if address.rsplit(":", 1)[-1].isdigit() else (address, "", "")
        port = int(given) if given else port
    return (f"{parts['scheme']}://{quote(username, safe='')}:{quote(password, safe='')}@{host}:{port}/"
            f"{quote(parts['vhost'], safe='')}")


class BrokerAdmin(Protocol):
    def put_user(self, username: str, password: str) -> bool: ...
    def set_permissions(self, vhost: str, username: str, grant: Grant) -> None: ...
    def delete_user(self, username: str) -> bool: ...


class Rabbitmqctl:
    """``rabbitmqctl`` on the broker's host (as root or the rabbitmq user); passwords go through stdin, never
    a command line another user could read in ps."""

    def __init__(self, command: Sequence[str] = ("rabbitmqctl",), timeout: float = 60) -> None:
        self.command, self.timeout = list(command), timeout

    def _run(self, *args: str, stdin: str | None = None) -> str:
        try:
            done = subprocess.run([*self.command, "-q", *args], input=stdin, capture_output=True, text=True,
                                  timeout=self.timeout)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise BrokerAdminError(f"rabbitmqctl {args[0]}: {exc}") from exc
        if done.returncode != 0:
            raise BrokerAdminError(f"rabbitmqctl {args[0]} failed: {(done.stderr or done.stdout).strip()[-500:]}")
        return done.stdout

    def put_user(self, username: str, password: str) -> bool:
        """Creates the user, or sets a new password and closes its open connections; True when created."""
        try:
            self._run("add_user", username, stdin=password + "\n")
            return True
        except BrokerAdminError as exc:
            if "already exists" not in str(exc):
                raise
        self._run("change_password", username, stdin=password + "\n")
        self._run("close_all_user_connections", username, "broker credentials rotated")
        return False

    def set_permissions(self, vhost: str, username: str, grant: Grant) -> None:
        self._run("set_permissions", "-p", vhost, username, grant.configure, grant.write, grant.read)

    def delete_user(self, username: str) -> bool:
        """Deletes the user (RabbitMQ closes its connections); False when there was none."""
        try:
            self._run("delete_user", username)
        except BrokerAdminError as exc:
            if "does not exist" in str(exc) or "no_such_user" in str(exc):
                return False
            raise
        return True

    def add_vhost(self, vhost: str) -> None:
        self._run("add_vhost", vhost)

    def delete_vhost(self, vhost: str) -> None:
        self._run("delete_vhost", vhost)


class ManagementApi:
    """The management plugin's HTTP API (``http://admin:password@host:15672``), for a portal that does not run
    on the broker's host (docker compose)."""

    def __init__(self, base_url: str, timeout: float = 10) -> None:
        import httpx

        parts = httpx.URL(base_url)
        self._client = httpx.Client(base_url=str(parts.copy_with(username=None, password=None)).rstrip("/"),
                                    auth=(parts.username, parts.password), timeout=timeout)

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        import httpx

        try:
            response = self._client.request(method, "/api" + path, json=body)
        except httpx.HTTPError as exc:
            raise BrokerAdminError(f"RabbitMQ management API {method} {path}: {exc}") from exc
        if response.status_code == 404 and method in ("GET", "DELETE"):
            return None
        if response.status_code >= 400:
            raise BrokerAdminError(f"RabbitMQ management API {method} {path}: {response.status_code} "
                                   f"{response.text[:300]}")
        return response.json() if response.content else {}

    def put_user(self, username: str, password: str) -> bool:
        name = quote(username, safe="")
        created = self._call("GET", f"/users/{name}") is None
        self._call("PUT", f"/users/{name}", {"password": password, "tags": ""})
        if not created:
            for conn in self._call("GET", f"/connections/username/{name}") or []:
                self._call("DELETE", f"/connections/{quote(conn['name'], safe='')}")
        return created

    def set_permissions(self, vhost: str, username: str, grant: Grant) -> None:
        self._call("PUT", f"/permissions/{quote(vhost, safe='')}/{quote(username, safe='')}",
                   {"configure": grant.configure, "write": grant.write, "read": grant.read})

    def delete_user(self, username: str) -> bool:
        return self._call("DELETE", f"/users/{quote(username, safe='')}") is not None


def broker_admin(admin_url: str = "") -> BrokerAdmin:
    """The management API at ``admin_url``, else ``rabbitmqctl`` on this host."""
    return ManagementApi(admin_url) if admin_url else Rabbitmqctl()


def declare_queues(app: Any, broker_url: str, names: Iterable[str]) -> None:
    """Declares ``names`` (queue, its direct exchange and the binding) as the portal's Celery app publishes to
    them, so that an agent whose user may not declare finds them in place."""
    with app.connection_for_write(broker_url) as conn:
        channel = conn.default_channel
        for name in names:
            app.amqp.queues[name](channel).declare()


@dataclass(frozen=True)
class AgentUser:
    username: str
    queues: tuple[str, ...]
    url: str
    created: bool


def do_put_agent_user(admin: BrokerAdmin, app: Any, *, broker_url: str, agent_id: int, hardware_slug: str,
                      address: str | None = None) -> AgentUser:
    """Creates (or rotates) the broker user of agent ``agent_id``, allowed to read ``hw.<hardware_slug>`` and
    ``agent.<agent_id>`` only, declares those queues on ``broker_url`` (the portal's), and returns the agent's
    broker URL (its password is not kept anywhere else)."""
    vhost = broker_parts(broker_url)["vhost"]
    queues = agent_queues(hardware_slug, agent_id)
    username, password = agent_username(agent_id, hardware_slug), new_password()
    declare_queues(app, broker_url, queues)
    created = admin.put_user(username, password)
    admin.set_permissions(vhost, username, agent_grant(queues))
    return AgentUser(username, tuple(queues), agent_broker_url(broker_url, username, password, address), created)
