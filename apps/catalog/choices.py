from __future__ import annotations

from django.db import models

# The dtypes a hardware may list and a job may ask for.
DTYPE_NAMES = frozenset({"float64", "float32", "tfloat32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2",
                         "float8_e4m3fnuz", "float8_e5m2fnuz", "hifloat8", "int8", "int4", "mxfp4", "mxfp8", "nvfp4",
                         "float4_e2m1fn"})


class Visibility(models.TextChoices):
    PUBLIC = "public", "public"
    PRIVATE = "private", "private (embargoed until release)"
