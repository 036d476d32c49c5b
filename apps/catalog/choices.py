from __future__ import annotations

from django.db import models


class Visibility(models.TextChoices):
    PUBLIC = "public", "public"
    PRIVATE = "private", "private (embargoed until release)"
