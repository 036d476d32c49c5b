"""What the portal holds to judge correctness itself (docs/references.md): each release's reference outputs,
computed on reference hardware and never sent to an agent, and the secret challenge drawn for each attempt of a
certify job."""

from __future__ import annotations

from django.db import models


class ReferenceState(models.TextChoices):
    QUEUED = "queued", "queued"
    FINISHED = "finished", "finished"
    FAILED = "failed", "failed"


class ReferenceRun(models.Model):
    """One reference run of a release for one pool version: its job on reference hardware (stages load and
    reference), the weights source it read, its own fresh needles (values included: portal only) and, once its
    ``reference`` section arrived, the outputs by kind and item id plus its needle accuracy per length."""

    release = models.ForeignKey("catalog.ModelRelease", on_delete=models.CASCADE, related_name="reference_runs")
    pool_version = models.CharField(max_length=64, db_index=True)
    source = models.CharField(max_length=500, help_text="the weights source the reference host read")
    job = models.OneToOneField("jobs.Job", null=True, blank=True, on_delete=models.SET_NULL,
                               related_name="reference_run")
    state = models.CharField(max_length=16, choices=ReferenceState.choices, default=ReferenceState.QUEUED)
    needles = models.JSONField(default=list, blank=True, help_text="the run's own needle items (values included)")
    outputs = models.JSONField(default=dict, blank=True,
                               help_text="kind -> id -> reference outputs; needle_accuracy: length -> accuracy")
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["release", "pool_version", "state"], name="reference_run_lookup")]

    def __str__(self) -> str:
        return f"reference of {self.release_id} ({self.pool_version[:12]}, {self.state})"


class Challenge(models.Model):
    """The challenge drawn for one attempt of a certify job: the items as sent (``items``: nonce, top_k and the
    items per kind, what the payload's ``challenge`` carries), the portal-only keys of those items (answers,
    metric options, needle values), and the sample sizes with the power rule behind them."""

    job = models.ForeignKey("jobs.Job", on_delete=models.CASCADE, related_name="challenges")
    attempt = models.PositiveIntegerField()
    nonce = models.CharField(max_length=64, db_index=True)
    pool_version = models.CharField(max_length=64)
    items = models.JSONField(help_text="the challenge as the agent receives it")
    keys = models.JSONField(default=dict, blank=True, help_text="portal only: kind -> id -> answer")
    sizes = models.JSONField(default=dict, blank=True, help_text="kind -> n and the power rule behind it")
    reruns = models.JSONField(default=dict, blank=True,
                              help_text="code item id -> the portal's own sandbox run of the target's completion "
                                        "{sha256, passed, status} (apps.evidence.reruns)")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["job_id", "attempt"]
        constraints = [models.UniqueConstraint(fields=["job", "attempt"], name="uniq_challenge_attempt")]

    def __str__(self) -> str:
        return f"challenge of job {self.job_id} attempt {self.attempt}"
