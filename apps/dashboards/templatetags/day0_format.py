"""Template filters of the dashboard pages."""

from __future__ import annotations

from django import template

from apps.dashboards.selectors import human_bytes

register = template.Library()


@register.filter
def iec_bytes(value: int | None) -> str:
    """Bytes in the units the plan and trend charts use (KiB, MiB, GiB); "—" when unknown, never a fake 0."""
    return "—" if value is None else human_bytes(value)
