"""Numbers and durations for people: lead times, parameter counts, byte sizes."""

from __future__ import annotations


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
