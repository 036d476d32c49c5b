"""Numbers and durations for people: lead times, parameter counts, byte sizes."""

from __future__ import annotations

from datetime import datetime


def hours_text(hours: float | None) -> str:
    """Lead time for people: "+5.2 h", "+3.1 d", "−12 h (before release)"; "" when not reached."""
    if hours is None:
        return ""
    sign = "−" if hours < 0 else "+"
    h = abs(hours)
    text = f"{sign}{h:.1f} h" if h < 72 else f"{sign}{h / 24:.1f} d"
    return text + (" (before release)" if hours < 0 else "")


def human_count(n: int | None) -> str:
    """116_829_156_672 -> "116.8 B"."""
    if n is None:
        return "–"
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return str(n)


def human_bytes(n: int | None) -> str:
    if n is None:
        return "–"
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def reached_times(raw: dict[str, str] | None) -> dict[int, datetime]:
    """A cell's ``tier_reached_at`` ("tier" -> ISO time) as tier -> time, made monotone: a tier is reached only
    once every tier below it is, so its time is the latest of theirs (evidence of a higher gate, such as the
    alignment, may arrive before a lower one's, such as the serve check)."""
    times: dict[int, datetime] = {}
    for key, value in (raw or {}).items():
        if str(key).isdigit() and isinstance(value, str):
            try:
                times[int(key)] = datetime.fromisoformat(value)
            except ValueError:
                continue
    out: dict[int, datetime] = {}
    latest: datetime | None = None
    for tier in sorted(times):
        latest = times[tier] if latest is None or times[tier] > latest else latest
        out[tier] = latest
    return out
