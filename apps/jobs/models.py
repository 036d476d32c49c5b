"""Adaptation jobs and their ordered event log."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from apps.jobs.choices import EventLevel, JobPurpose, JobState


class Job(models.Model):
    """One adaptation run of a model on a hardware. ``spec`` holds what was asked (stages, dtype, plan
    overrides, thresholds, bench settings). State changes only through ``services.do_transition_job``."""

    model = models.ForeignKey("catalog.ModelRelease", on_delete=models.CASCADE, related_name="jobs")
    hardware = models.ForeignKey("catalog.Hardware", on_delete=models.CASCADE, related_name="jobs")
    organization = models.ForeignKey(
        "accounts.Organization", null=True, blank=True, on_delete=models.SET_NULL, related_name="jobs"
    )
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="jobs"
    )
    spec = models.JSONField(default=dict)
    purpose = models.CharField(
        max_length=16, choices=JobPurpose.choices, default=JobPurpose.CERTIFY, db_index=True,
        help_text="certify: evidence for the cell; reference: the release's reference outputs, on reference hardware")
    nonce = models.CharField(max_length=64, blank=True,
                             help_text="a fresh secret per attempt (set at each dispatch); results bind to it")
    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.QUEUED, db_index=True)
    attempts = models.PositiveIntegerField(default=0)
    agent = models.ForeignKey("fleet.Agent", null=True, blank=True, on_delete=models.SET_NULL, related_name="jobs")
    failed_stage = models.CharField(max_length=32, blank=True)
    error = models.TextField(blank=True)
    events_acked = models.BigIntegerField(default=0, help_text="highest contiguous event seq stored")
    events_max_seq = models.BigIntegerField(default=0, help_text="highest event seq stored")
    nodes = models.PositiveSmallIntegerField(default=1, help_text="hosts the job's plan spans: one agent each")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    updated_at = models.DateTimeField(auto_now=True)
    dispatched_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["model", "hardware", "-created_at"], name="job_cell_newest")]

    def __str__(self) -> str:
        return f"job {self.pk} {self.model_id}x{self.hardware_id} {self.state}"

    @property
    def stages(self) -> list[str]:
        return list(self.spec.get("stages") or [])


class JobEvent(models.Model):
    """One event an agent reported, stored before it is broadcast. A job's log is one sequence per node:
    node 0's (the job's agent, and the portal's own events; what the job's ``events_acked`` counts) and, on a
    multi-node job, one for each other node, numbered by the portal as the node's own events arrive in order
    (``node_services``). ``seq`` starts at 1 and orders a node's sequence; storing is idempotent on
    (job, node, seq)."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")
    node = models.PositiveSmallIntegerField(default=0, db_default=0, help_text="the node rank that reported it")
    seq = models.BigIntegerField()
    ts = models.DateTimeField()
    stage = models.CharField(max_length=32, blank=True)
    kind = models.CharField(max_length=32)
    level = models.CharField(max_length=8, choices=EventLevel.choices, default=EventLevel.INFO)
    message = models.TextField(blank=True)
    data = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["job_id", "node", "seq"]
        constraints = [models.UniqueConstraint(fields=["job", "node", "seq"], name="uniq_job_node_event_seq")]

    def __str__(self) -> str:
        return f"{self.job_id}#{self.seq} {self.kind}" + (f" (node {self.node})" if self.node else "")


class NodeState(models.TextChoices):
    RESERVED = "reserved", "reserved"
    RUNNING = "running", "running"
    FINISHED = "finished", "finished"
    FAILED = "failed", "failed"
    RELEASED = "released", "released"


ACTIVE_NODE_STATES = (NodeState.RESERVED, NodeState.RUNNING)


class JobNode(models.Model):
    """One host of a multi-node job's attempt: the agent reserved as node ``rank`` and where the ranks meet
    (node 0's reported address, a port). A job's nodes are reserved together or not at all
    (``placement.reserve_nodes``); an agent holds at most one active reservation (a partial unique constraint).
    Node 0 claims the job and posts its results; the other nodes claim their row and post their stage events
    into ``events`` (idempotent on their own ``seq``, acked in ``events_acked``)."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="node_rows")
    attempt = models.PositiveIntegerField()
    rank = models.PositiveSmallIntegerField()
    agent = models.ForeignKey("fleet.Agent", on_delete=models.CASCADE, related_name="job_nodes")
    master_addr = models.CharField(max_length=255)
    master_port = models.PositiveIntegerField()
    state = models.CharField(max_length=16, choices=NodeState.choices, default=NodeState.RESERVED)
    error = models.TextField(blank=True)
    events = models.JSONField(default=list, blank=True, help_text="this node's stage events, oldest first")
    events_acked = models.BigIntegerField(default=0)
    reserved_at = models.DateTimeField(auto_now_add=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["job_id", "attempt", "rank"]
        constraints = [
            models.UniqueConstraint(fields=["job", "attempt", "rank"], name="uniq_job_node_rank"),
            models.UniqueConstraint(fields=["agent"], condition=models.Q(state__in=["reserved", "running"]),
                                    name="one_active_node_per_agent"),
        ]

    def __str__(self) -> str:
        return f"job {self.job_id} node {self.rank}/{self.attempt} on agent {self.agent_id} ({self.state})"
