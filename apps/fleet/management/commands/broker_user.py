"""``manage.py broker_user``: the RabbitMQ user of one agent, allowed to read its hardware's queue and its own
queue and nothing else (``day0portal.rabbitmq``). Running it again rotates the password (and closes the old
connections); ``--delete`` removes the user. The broker URL for the agent host is printed once, on stdout.

The agent is named by ``--agent-id`` (a registered agent of ``--hardware``) or by ``--hostname``: a host that has
not registered yet gets its agent row now, and keeps that id when it registers with the same host name
(``DAY0_AGENT_HOSTNAME``)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from apps.catalog.models import Hardware
from apps.fleet.models import Agent
from day0portal import rabbitmq


class Command(BaseCommand):
    help = "Create or rotate the RabbitMQ user of an agent (its own queues only) and print its broker URL once."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--hardware", required=True, help="hardware slug: the agent reads queue hw.<slug>")
        who = parser.add_mutually_exclusive_group(required=True)
        who.add_argument("--agent-id", type=int, help="a registered agent of this hardware: it reads agent.<id>")
        who.add_argument("--hostname", help="the agent's host name (DAY0_AGENT_HOSTNAME); registered now if new")
        parser.add_argument("--address", default=None,
                            help="host[:port] the agent host reaches the broker at (default: the portal's)")
        parser.add_argument("--delete", action="store_true", help="delete the agent's broker user instead")

    def handle(self, *args: Any, **options: Any) -> None:
        hardware = Hardware.objects.filter(slug=options["hardware"]).first()
        if hardware is None:
            raise CommandError(f"no hardware {options['hardware']!r}")
        if not options["delete"]:
            try:
                rabbitmq.broker_parts(settings.CELERY_BROKER_URL)  # before an agent row is made for nothing
            except rabbitmq.BrokerAdminError as exc:
                raise CommandError(str(exc)) from exc
        agent = self._agent(hardware, options)
        from day0portal.celery import app  # the Celery app autodiscovers the apps' tasks: loaded when needed

        try:
            admin = rabbitmq.broker_admin(settings.BROKER_ADMIN_URL)
            if options["delete"]:
                username = rabbitmq.agent_username(agent.pk, hardware.slug)
                gone = admin.delete_user(username)
                self.stderr.write(f"broker user {username} {'deleted' if gone else 'did not exist'}")
                return
            user = rabbitmq.do_put_agent_user(admin, app, broker_url=settings.CELERY_BROKER_URL, agent_id=agent.pk,
                                              hardware_slug=hardware.slug, address=options["address"])
        except rabbitmq.BrokerAdminError as exc:
            raise CommandError(str(exc)) from exc
        self.stderr.write(f"broker user {user.username} ({'created' if user.created else 'password rotated'}) "
                          f"reads {', '.join(user.queues)} only; agent {agent.pk} on {agent.hostname}. "
                          "Give the agent this URL as DAY0_AGENT_BROKER (it is shown only now):")
        self.stdout.write(user.url)

    def _agent(self, hardware: Hardware, options: dict[str, Any]) -> Agent:
        if options["agent_id"] is not None:
            agent = Agent.objects.filter(pk=options["agent_id"]).first()
            if agent is None or agent.hardware_id != hardware.pk:
                raise CommandError(f"no agent {options['agent_id']} on {hardware.slug}")
            return agent
        hostname = options["hostname"].strip()
        if not hostname or len(hostname) > 255:
            raise CommandError("--hostname must be 1 to 255 characters")
        if options["delete"]:
            agent = Agent.objects.filter(hardware=hardware, hostname=hostname).first()
            if agent is None:
                raise CommandError(f"no agent {hostname!r} on {hardware.slug}")
            return agent
        return Agent.objects.get_or_create(hardware=hardware, hostname=hostname)[0]
