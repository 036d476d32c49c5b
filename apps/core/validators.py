from __future__ import annotations

from datetime import UTC, datetime

from django.core.validators import RegexValidator

# Catalog slugs: letters, digits, '.', '_' and '-' (model names carry versions like "llama-3.1-8b").
slug_validator = RegexValidator(
    r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
    "use letters, digits, '.', '_' or '-' (starting with a letter or digit)",
    code="invalid_slug",
)


def as_utc(value: datetime) -> datetime:
    """An aware ``value`` in UTC, a naive one taken as UTC. PostgreSQL refuses offsets beyond ±15:59 (Python
    allows up to ±23:59), so times from clients are converted before a query or an insert sees them.
    ``ValueError`` when the conversion leaves the representable years (9999-12-31T23:00-16:00)."""
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    try:
        return value.astimezone(UTC)
    except OverflowError as exc:
        raise ValueError(f"{value.isoformat()} is out of range in UTC") from exc
