"""The compatibility matrix: one cell per model × hardware × engine@version, its tier computed from evidence."""

from __future__ import annotations

from typing import Any

from django.db import models

from apps.catalog.engines import default_engine_id
from contract.tiers import TIER_NAMES


class Cell(models.Model):
    """A model on a hardware served by one engine at one catalog version (``engine``: the catalog row the job
    named, the bundled ``day0`` by default). Written only by ``apps.matrix.services``: the tier from the newest
    evidence of each stage of that engine's jobs, "failed at <stage>" from the newest finished job, and the fits
    estimate from the config."""

    model = models.ForeignKey("catalog.ModelRelease", on_delete=models.CASCADE, related_name="cells")
    hardware = models.ForeignKey("catalog.Hardware", on_delete=models.CASCADE, related_name="cells")
    # a cell saved without one is the bundled runtime's (every cell before engines existed; ``save``)
    engine = models.ForeignKey("catalog.Engine", on_delete=models.PROTECT, related_name="cells")
    tier = models.PositiveSmallIntegerField(default=0, db_index=True)
    stage_passed = models.JSONField(default=dict, blank=True)  # stage -> the newest evidence's verdict passes
    # stage -> the newest verdict: {"status", "reasons", "claimed", "disputed", "job", "defaults_version", ...}
    verdicts = models.JSONField(default=dict, blank=True)
    custom_thresholds = models.BooleanField(default=False, help_text="the tier rests on looser thresholds")
    synthetic = models.BooleanField(default=False, help_text="the tier rests on seeded (synthetic) evidence")
    disputed = models.JSONField(default=list, blank=True)  # stages whose newest claim and verdict disagree
    tier_reached_at = models.JSONField(default=dict, blank=True)  # "tier" -> ISO time it was first reached
    current_tier_reached_at = models.DateTimeField(null=True, blank=True)
    lead_hours = models.FloatField(null=True, blank=True, help_text="Day-0 lead time of the current tier, hours")
    failed_stage = models.CharField(max_length=32, blank=True)
    error = models.TextField(blank=True)
    last_job = models.ForeignKey("jobs.Job", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    job_count = models.PositiveIntegerField(default=0)
    # the fits estimate, from the model's config alone (contract.planner.plan_report)
    fits = models.BooleanField(null=True)
    fits_devices = models.PositiveIntegerField(null=True, blank=True)
    fits_plan = models.JSONField(default=dict, blank=True)
    fits_error = models.TextField(blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["model", "hardware", "engine"], name="uniq_cell_engine")]

    def __str__(self) -> str:
        return f"{self.model_id}x{self.hardware_id}x{self.engine_id}: {self.tier}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        """A cell saved without an engine is the default engine's (the portal's own writers always name one; an
        unsaved ``Cell()`` needs no database)."""
        if self.engine_id is None:
            self.engine_id = default_engine_id()
        super().save(*args, **kwargs)

    @property
    def tier_name(self) -> str:
        return TIER_NAMES[self.tier]


class CellHistory(models.Model):
    """One entry of a cell's history: its tier changed, or its verdicts were re-judged, and why ("hardware
    nvidia-h100 memory_bytes changed", "defaults 2026.12.3 → 2026.12.4", "new evidence from job 42").
    Written only by ``apps.matrix.services``."""

    class Kind(models.TextChoices):
        TIER = "tier", "tier changed"
        REJUDGE = "rejudge", "verdicts re-judged"

    cell = models.ForeignKey(Cell, on_delete=models.CASCADE, related_name="history")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    tier_before = models.PositiveSmallIntegerField()
    tier_after = models.PositiveSmallIntegerField()
    reason = models.TextField()
    data = models.JSONField(default=dict, blank=True)  # e.g. {"stages": {"plan": ["pass", "fail"]}}
    at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"cell {self.cell_id} {self.kind} {self.tier_before}→{self.tier_after}: {self.reason[:60]}"
