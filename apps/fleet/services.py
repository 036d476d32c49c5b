"""Agent registration and heartbeats."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.utils import timezone

from apps.accounts.access import Actor
from apps.accounts.choices import Scope
from apps.core.errors import ConflictError
from apps.fleet.models import Agent
from apps.fleet.stacks import do_observe_stack
from apps.jobs.models import Job
from apps.jobs.selectors import visible_jobs


@transaction.atomic
def do_register_agent(*, hardware_id: int, hostname: str, token_id: int | None, capabilities: dict[str, Any],
                      versions: dict[str, Any]) -> tuple[Agent, bool]:
    """Registers (or re-registers) the agent on ``hostname`` for a hardware; counts as a heartbeat."""
    agent, created = Agent.objects.update_or_create(
        hardware_id=hardware_id, hostname=hostname,
        defaults={"token_id": token_id, "capabilities": capabilities, "versions": versions,
                  "last_heartbeat_at": timezone.now()},
    )
    do_observe_stack(agent.hardware, hostname=hostname, versions=versions)  # a new stack re-validates
    return agent, created


def check_register_agent(actor: Actor, *, hardware_slug: str | None, hostname: str, capabilities: dict[str, Any],
                         versions: dict[str, Any]) -> tuple[Agent, bool]:
    """Only an agent token registers, and only for the hardware it is bound to. A host registered with another
    token that is still active stays that token's (a 409): the agent row, and the jobs it claimed, cannot be taken
    over by a second token of the same hardware; after the old token is revoked, the host re-registers."""
    if not actor.has_scope(Scope.AGENT):
        raise PermissionDenied("registering an agent needs an agent token")
    token = actor.token
    if hardware_slug and hardware_slug != token.hardware.slug:
        raise PermissionDenied(f"this agent token is bound to {token.hardware.slug}, not {hardware_slug}")
    existing = Agent.objects.select_related("token").filter(hardware_id=token.hardware_id, hostname=hostname).first()
    if (existing is not None and existing.token is not None and existing.token_id != token.pk
            and existing.token.is_active):
        raise ConflictError(f"host {hostname!r} is registered on {token.hardware.slug} with another active agent "
                            f"token ({existing.token.name!r}); revoke that token first, or register another host name")
    return do_register_agent(hardware_id=token.hardware_id, hostname=hostname, token_id=token.pk,
                             capabilities=capabilities, versions=versions)


def do_heartbeat_agent(agent: Agent, *, current_job_id: int | None = None,
                       versions: dict[str, Any] | None = None) -> Agent:
    """Marks the agent alive; ``versions`` (its environment lock, optional) is compared with the pool's stack."""
    if current_job_id is not None and not Job.objects.filter(pk=current_job_id, hardware_id=agent.hardware_id).exists():
        raise ValidationError({"current_job": f"no job {current_job_id} on this agent's hardware"})
    agent.last_heartbeat_at = timezone.now()
    agent.current_job_id = current_job_id
    agent.save(update_fields=["last_heartbeat_at", "current_job"])
    if versions:
        with transaction.atomic():
            if versions != agent.versions:
                agent.versions = versions
                agent.save(update_fields=["versions"])
            do_observe_stack(agent.hardware, hostname=agent.hostname, versions=versions)
    return agent


def check_heartbeat_agent(actor: Actor, agent: Agent, *, current_job_id: int | None = None,
                          versions: dict[str, Any] | None = None) -> Agent:
    """Heartbeats come from the token the agent registered with; the job it reports must be one the token may
    see (``jobs.selectors.visible_jobs``)."""
    if not actor.has_scope(Scope.AGENT) or actor.hardware_id != agent.hardware_id:
        raise PermissionDenied("heartbeats come from an agent token bound to the agent's hardware")
    if agent.token_id != actor.token.pk:
        raise PermissionDenied(f"agent {agent.pk} is registered with another token; an agent beats with its own")
    if current_job_id is not None and not visible_jobs(actor).filter(pk=current_job_id).exists():
        raise ValidationError({"current_job": f"no job {current_job_id} on this agent's hardware"})
    return do_heartbeat_agent(agent, current_job_id=current_job_id, versions=versions)
