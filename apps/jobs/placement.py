"""Where a job runs when its plan spans several hosts: how many nodes it needs, and the agents reserved for them.

A job of N > 1 nodes runs on N agents of its hardware at once or not at all: ``reserve_nodes`` locks N idle
agents (online, running nothing, holding no other reservation) with ``SELECT … FOR UPDATE SKIP LOCKED`` so two
dispatchers never take the same agent, and writes one ``JobNode`` per agent (node 0 first, by agent id); with
fewer idle agents it reserves none and says how many are free against how many are needed. The ranks meet at
node 0's reported address (its ``capabilities["address"]``, else its host name) and a port of the job's own.

Imports models only (services and dispatch import it), so no import cycle forms; the agents are read through
the hardware's ``agents`` relation (the fleet app sits above jobs)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.utils import timezone

from apps.catalog.models import Hardware
from apps.jobs.choices import ONLINE_WINDOW
from apps.jobs.models import ACTIVE_NODE_STATES, Job, JobNode, NodeState
from contract.nodes import PORTS_PER_JOB

if TYPE_CHECKING:
    from apps.fleet.models import Agent

DEFAULT_RENDEZVOUS_PORT = 29500
PORT_SLOTS = 1000


def plan_nodes(model: Any, hardware: Any, spec: dict[str, Any]) -> int:
    """Hosts the job's plan spans: the planner's plan for the model's config on ``hardware`` with the job's
    pinned degrees (the plan the matrix shows); 1 for hardware whose devices share one host's memory, or when the
    config cannot be planned (the plan stage reports that)."""
    if hardware.shared_memory or hardware.devices_per_node < 1:
        return 1
    from contract.planner import plan_report

    try:
        report = plan_report(model.config, memory_bytes=hardware.memory_bytes,
                             devices_per_node=hardware.devices_per_node, dtype=spec.get("dtype") or "auto",
                             tp=spec.get("tp"), pp=spec.get("pp"), ep=spec.get("ep"))
    except Exception:  # noqa: BLE001 - an unplannable config runs on one agent; its plan stage says why
        return 1
    plan = report.get("plan") or {}
    return max(1, int(plan.get("nodes") or 1)) if report.get("fits") else 1


def idle_agents(hardware: Hardware) -> Any:
    """Agents of the hardware that are online, run no job and hold no active reservation."""
    since = timezone.now() - ONLINE_WINDOW
    busy = JobNode.objects.filter(state__in=ACTIVE_NODE_STATES).values("agent_id")
    return hardware.agents.filter(last_heartbeat_at__gte=since, current_job__isnull=True).exclude(pk__in=busy)


def waiting_reason(job: Job, free: int) -> str:
    since = timezone.now() - ONLINE_WINDOW
    online = job.hardware.agents.filter(last_heartbeat_at__gte=since).count()
    return (f"waiting for {job.nodes} agents of {job.hardware.slug} at once (the plan spans {job.nodes} nodes): "
            f"{free} free of {online} online; none starts until {job.nodes} are free")


def agent_has_engine(capabilities: Any, engine: dict[str, Any]) -> bool:
    """Whether an agent's capabilities advertise ``engine`` (``capabilities["engines"]``: name -> its executable
    path, or {"path", "version"}); an engine without an executable of its own (the generic one, whose command the
    job gives) runs on any agent."""
    if not engine.get("executable"):
        return True
    engines = capabilities.get("engines") if isinstance(capabilities, dict) else None
    return isinstance(engines, dict) and bool(engines.get(engine.get("name")))


def engine_waiting_reason(job: Job) -> str | None:
    """Why ``job`` cannot be dispatched yet: it names an engine no online agent of its hardware advertises (None
    when one does, or the job runs the bundled runtime)."""
    engine = job.spec.get("engine")
    if not engine:
        return None
    since = timezone.now() - ONLINE_WINDOW
    online = list(job.hardware.agents.filter(last_heartbeat_at__gte=since).values_list("capabilities", flat=True))
    if any(agent_has_engine(caps, engine) for caps in online):
        return None
    ref = f"{engine.get('name')}@{engine.get('version')}" if engine.get("version") else engine.get("name")
    return (f"waiting for an agent of {job.hardware.slug} with engine {ref}: none of its {len(online)} online "
            f"agent(s) has {engine.get('executable') or engine.get('name')} (on its PATH, or given with "
            f"--engine {engine.get('name')}=PATH)")


def rendezvous(job: Job, node0: Agent) -> tuple[str, int]:
    """(address, first port) where the job's ranks meet: node 0's reported address and a port of this job's."""
    caps = node0.capabilities if isinstance(node0.capabilities, dict) else {}
    address = caps.get("address") if isinstance(caps.get("address"), str) and caps.get("address") else node0.hostname
    base = caps.get("rendezvous_port")
    base = base if isinstance(base, int) and not isinstance(base, bool) and 1024 <= base <= 60000 \
        else DEFAULT_RENDEZVOUS_PORT
    return address, base + PORTS_PER_JOB * (job.pk % PORT_SLOTS)


def reserve_nodes(job: Job, attempt: int) -> tuple[list[JobNode], str | None]:
    """Reserve ``job.nodes`` idle agents for ``attempt`` (the caller holds the job's row lock in a transaction):
    (the nodes, None), or ([], why it waits) when fewer are free; then nothing is reserved."""
    candidates = idle_agents(job.hardware)
    engine = job.spec.get("engine") or {}
    if engine.get("executable"):  # only agents that advertise the job's engine
        candidates = candidates.filter(capabilities__engines__has_key=engine.get("name"))
    free = list(candidates.select_for_update(skip_locked=True, of=("self",)).order_by("pk")[: job.nodes])
    if len(free) < job.nodes:
        return [], waiting_reason(job, len(free))
    address, port = rendezvous(job, free[0])
    nodes = [JobNode(job=job, attempt=attempt, rank=rank, agent=agent, master_addr=address, master_port=port)
             for rank, agent in enumerate(free)]
    JobNode.objects.bulk_create(nodes)
    return nodes, None


def release_nodes(job_id: int) -> int:
    """End the job's active reservations (it finished, was cancelled or goes back to the queue)."""
    return JobNode.objects.filter(job_id=job_id, state__in=ACTIVE_NODE_STATES).update(
        state=NodeState.RELEASED, finished_at=timezone.now())


def node_payload(node: JobNode, nnodes: int) -> dict[str, Any]:
    """What node ``node.rank``'s agent is told: the torchrun convention (``agents.runtime.nodes.NodeSpec``)."""
    return {"nnodes": nnodes, "node_rank": node.rank, "master_addr": node.master_addr,
            "master_port": node.master_port, "agent": node.agent_id}
