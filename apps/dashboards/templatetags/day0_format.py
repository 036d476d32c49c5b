"""Template filters of the dashboard pages."""

from __future__ import annotations

from django import template

from apps.dashboards.selectors import hours_text, human_bytes
from apps.dashboards.selectors import human_count as format_count

register = template.Library()


@register.filter
def iec_bytes(value: int | None) -> str:
    """Bytes in the units the plan and trend charts use (KiB, MiB, GiB); "—" when unknown, never a fake 0."""
    return "—" if value is None else human_bytes(value)


@register.filter
def human_count(value: int | None) -> str:
    """116_829_156_672 -> "116.8 B"."""
    return format_count(value)


@register.filter
def intcomma_plain(value: int | None) -> str:
    """1234567 -> "1,234,567" (no locale, no humanize app)."""
    return "—" if value is None else f"{value:,}"


@register.filter
def lead_text(hours: float | None) -> str:
    """A signed Day-0 lead time: "+5.2 h", "−12.0 h (before release)"; "" when not reached."""
    return hours_text(hours)


@register.filter
def get_item(mapping: dict | None, key: str) -> object:
    """``mapping[key]`` in a template ("" when absent)."""
    return (mapping or {}).get(key, "")


@register.filter
def split_words(text: str) -> list[str]:
    return text.split()


@register.filter
def percent(value: float | None, digits: int = 1) -> str:
    """A fraction as a percentage: 0.0423 -> "4.2 %"; "—" when unknown."""
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return "—"
    return f"{100 * value:.{int(digits)}f} %"
