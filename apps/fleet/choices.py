"""What a stack change of a hardware pool re-validates."""

from __future__ import annotations

from django.db import models


class RevalidationPolicy(models.TextChoices):
    OFF = "off", "record stack changes only"
    AT_OR_ABOVE_TIER = "tier", "re-validate cells at or above a tier"
    ALL = "all", "re-validate every cell with evidence"
