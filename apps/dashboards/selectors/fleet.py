"""The fleet page: every agent, its hardware, last heartbeat, current job and software stack."""

from __future__ import annotations

from django.utils import timezone

from apps.accounts.access import Actor
from apps.fleet.models import ONLINE_WINDOW, Agent
from apps.jobs.selectors import visible_jobs


def fleet(actor: Actor, *, hardware_id: int | None = None) -> list[Agent]:
    """Agents (newest heartbeat first); ``agent.job_visible`` says whether ``actor`` may see its current job
    (an embargoed model's job shows only as "busy"). Two queries."""
    agents = Agent.objects.select_related("hardware", "current_job__model").order_by(
        "hardware__slug", "-last_heartbeat_at", "hostname")
    if hardware_id is not None:
        agents = agents.filter(hardware_id=hardware_id)
    rows = list(agents)
    current = [a.current_job_id for a in rows if a.current_job_id]
    visible = set(visible_jobs(actor).filter(pk__in=current).values_list("pk", flat=True)) if current else set()
    for a in rows:
        a.job_visible = a.current_job_id in visible
        a.stack = {k: v for k, v in (a.versions or {}).items() if isinstance(v, str | int | float)}
    return rows


def online_agent_count(hardware_id: int) -> int:
    """Agents of a hardware with a recent heartbeat (one query)."""
    return Agent.objects.filter(hardware_id=hardware_id, last_heartbeat_at__gte=timezone.now() - ONLINE_WINDOW).count()
