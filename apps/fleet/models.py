"""Agents: Celery workers on accelerator hosts, one hardware pool each; the software stack each pool's agents
report, its changes and the pool's re-validation policy."""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from apps.fleet.choices import RevalidationPolicy
from apps.jobs.choices import ONLINE_WINDOW


class Agent(models.Model):
    """One agent process on a host, registered with an agent token bound to its hardware.

    Registration is idempotent on (hardware, hostname); heartbeats update ``last_heartbeat_at``."""

    hardware = models.ForeignKey("catalog.Hardware", on_delete=models.CASCADE, related_name="agents")
    hostname = models.CharField(max_length=255)
    token = models.ForeignKey("accounts.ApiToken", null=True, blank=True, on_delete=models.SET_NULL)
    capabilities = models.JSONField(default=dict, blank=True)
    versions = models.JSONField(default=dict, blank=True)
    registered_at = models.DateTimeField(auto_now_add=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    current_job = models.ForeignKey("jobs.Job", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")

    class Meta:
        ordering = ["hardware_id", "hostname"]
        constraints = [models.UniqueConstraint(fields=["hardware", "hostname"], name="uniq_agent_host")]

    def __str__(self) -> str:
        return f"{self.hostname} ({self.hardware_id})"

    @property
    def online(self) -> bool:
        return self.last_heartbeat_at is not None and timezone.now() - self.last_heartbeat_at < ONLINE_WINDOW


class HardwarePolicy(models.Model):
    """What a stack change of a hardware pool triggers: nothing but the record (``off``), re-validation jobs
    for its cells at or above ``min_tier`` (``tier``), or for every cell with evidence (``all``). A hardware
    without a row behaves as ``off``."""

    hardware = models.OneToOneField("catalog.Hardware", on_delete=models.CASCADE, related_name="stack_policy")
    policy = models.CharField(max_length=8, choices=RevalidationPolicy.choices, default=RevalidationPolicy.OFF)
    min_tier = models.PositiveSmallIntegerField(default=1)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "alerts_hardwarepolicy"  # moved from the alerts app; the table kept its name
        verbose_name_plural = "hardware policies"

    def __str__(self) -> str:
        return f"{self.hardware_id}: {self.policy}"


class HardwareStack(models.Model):
    """The software stack a hardware pool's agents reported last (runtime commit, torch, driver, toolkit,
    device), the reference the next report is compared with."""

    hardware = models.OneToOneField("catalog.Hardware", on_delete=models.CASCADE, related_name="stack")
    lock = models.JSONField(default=dict)
    reported_by = models.CharField(max_length=255, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "alerts_hardwarestack"  # moved from the alerts app; the table kept its name

    def __str__(self) -> str:
        return f"{self.hardware_id}: {self.lock}"


class StackChange(models.Model):
    """A hardware pool's stack changed: what it was, what it became, which host reported it, and the
    re-validation jobs its policy queued. Cells whose evidence predates it show as stale since it."""

    hardware = models.ForeignKey("catalog.Hardware", on_delete=models.CASCADE, related_name="stack_changes")
    hostname = models.CharField(max_length=255, blank=True)
    before = models.JSONField(default=dict)
    after = models.JSONField(default=dict)
    changed = models.JSONField(default=list, help_text="the keys whose values differ")
    policy = models.CharField(max_length=8, choices=RevalidationPolicy.choices, default=RevalidationPolicy.OFF)
    jobs = models.JSONField(default=list, blank=True, help_text="ids of the re-validation jobs queued")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        db_table = "alerts_stackchange"  # moved from the alerts app; the table kept its name
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.hardware_id} {', '.join(self.changed)} at {self.created_at}"
