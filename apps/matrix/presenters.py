"""HTML of matrix cells, built in Python: the page shows up to ~8,000 cells and a template tag per cell field
would cost most of the page's time budget. Every value is escaped."""

from __future__ import annotations

from html import escape

from agents.pipeline.tiers import TIER_NAMES
from apps.catalog.models import Hardware, ModelRelease
from apps.matrix.selectors import CellView


def human_count(n: int | None) -> str:
    """1_234_000_000 -> "1.23B"."""
    if n is None:
        return "?"
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return str(n)


def human_hours(hours: float | None) -> str:
    if hours is None:
        return ""
    sign = "−" if hours < 0 else ""
    h = abs(hours)
    if h < 48:
        return f"{sign}{h:.0f}h"
    return f"{sign}{h / 24:.0f}d"


def cell_html(model_slug: str, hardware_slug: str, cell: CellView | None, hardware_name: str = "") -> str:
    """One ``<td>``: tier label (and colour class), failed stage, fits estimate (on the hardware's name, the slug
    in its tooltip), lead time; links to the cell. Slugs and name arrive already HTML-escaped."""
    if cell is None:
        return '<td class="cell tier-none">—</td>'
    parts = [f'<span class="tier-label">{cell.tier} · {TIER_NAMES[cell.tier]}</span>']
    if cell.failed_stage:
        parts.append(f'<span class="failed">failed at {escape(cell.failed_stage)}</span>')
    if cell.fits is True:
        parts.append(f'<span class="fits" title="{cell.fits_devices} × {hardware_slug}">'
                     f'fits on {cell.fits_devices} × {hardware_name or hardware_slug}</span>')
    elif cell.fits is False:
        parts.append('<span class="fits no-fit">does not fit</span>')
    if cell.lead_hours is not None and cell.tier:
        parts.append(f'<span class="lead" title="Day-0 lead time to tier {cell.tier}">'
                     f'+{human_hours(cell.lead_hours)}</span>')
    failed = " failed-cell" if cell.failed_stage else ""
    return (f'<td class="cell tier-{cell.tier}{failed}"><a href="/cells/{model_slug}/{hardware_slug}/">'
            f'{"".join(parts)}</a></td>')


def rows_html(models: list[ModelRelease], hardware: list[Hardware],
              cells: dict[tuple[int, int], CellView]) -> list[str]:
    """The cells of every model row, as HTML (one string per row)."""
    columns = [(hw.pk, escape(hw.slug), escape(hw.name)) for hw in hardware]
    out = []
    for model in models:
        model_id, model_slug = model.pk, escape(model.slug)
        out.append("".join(cell_html(model_slug, slug, cells.get((model_id, hw_id)), name)
                           for hw_id, slug, name in columns))
    return out
