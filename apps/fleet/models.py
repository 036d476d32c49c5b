"""Agents: Celery workers on accelerator hosts, one hardware pool each."""

from __future__ import annotations

from datetime import timedelta

from django.db import models
from django.utils import timezone

# An agent whose last heartbeat is older than this is shown as offline.
ONLINE_WINDOW = timedelta(seconds=90)


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
