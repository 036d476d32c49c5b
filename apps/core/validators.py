from __future__ import annotations

from django.core.validators import RegexValidator

# Catalog slugs: letters, digits, '.', '_' and '-' (model names carry versions like "llama-3.1-8b").
slug_validator = RegexValidator(
    r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
    "use letters, digits, '.', '_' or '-' (starting with a letter or digit)",
    code="invalid_slug",
)
