"""HTML of matrix cells, built in Python: the page shows up to ~8,000 cells and a template tag per cell field
would cost most of the page's time budget. Every value is escaped."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from html import escape
from urllib.parse import quote

from apps.catalog.models import Hardware, ModelRelease
from apps.core.formatting import reached_times
from apps.matrix.selectors import CellView, lead_hours
from contract.tiers import TIER_NAMES


def human_count(n: int | None) -> str:
    """1_234_000_000 -> "1.23B"."""
    if n is None:
        return "?"
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return str(n)


ZERO = timedelta(0)
DTYPE_SHORT = {"float8_e4m3fn": "FP8", "float8_e5m2": "FP8 e5m2", "mxfp4": "MXFP4", "bfloat16": "bf16",
               "float16": "fp16", "float32": "fp32", "int8": "int8", "int4": "int4"}


def dtype_short(dtype: str | None) -> str:
    """"float8_e4m3fn" -> "FP8": the format as people name it."""
    return DTYPE_SHORT.get(dtype or "", dtype or "?")


def human_hours(hours: float | None) -> str:
    """A signed lead time: "+5.2 h", "−9 h", "+3 d"; "" when unknown (never "+−9h")."""
    if hours is None:
        return ""
    sign = "−" if hours < 0 else "+"
    h = abs(hours)
    if h < 10:
        return f"{sign}{h:.1f}\u202fh"
    if h < 48:
        return f"{sign}{h:.0f}\u202fh"
    return f"{sign}{h / 24:.0f}\u202fd"


MONTHS = ("", "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def _utc(when: datetime) -> datetime:
    return when if when.utcoffset() == ZERO else when.astimezone(UTC)


def cell_title(cell: CellView, hardware_name: str, released_at: datetime | None, regressions: list[str],
               times: dict[int, datetime] | None = None) -> str:
    """The hover text: when each tier was reached and its lead time, the fit and its format, open regressions.
    ``times``: the cell's monotone tier times, when the caller has them (formatted without strftime: 8,000
    cells a page)."""
    lines = []
    for tier, when in (reached_times(cell.tier_reached) if times is None else times).items():
        if tier > cell.tier:
            continue
        lead = lead_hours(when, released_at)
        w = _utc(when)
        lines.append(f"T{tier} {TIER_NAMES[tier]}: {w.year:04d}-{w.month:02d}-{w.day:02d} {w.hour:02d}:{w.minute:02d}"
                     " UTC" + (f" ({human_hours(lead)} from release)" if lead is not None else ""))
    if cell.failed_stage in ("cancelled", "lost"):  # a job that ended without a stage to blame
        lines.append(f"a job was {cell.failed_stage} before proving its stages")
    elif cell.failed_stage:
        lines.append(f"newest job failed at {cell.failed_stage}")
    why = f": {cell.quant_reason}" if cell.quant_mode == "emulated" and cell.quant_reason else ""
    mode = f" ({cell.quant_mode} on this hardware{why})" if cell.quant_mode else ""
    if cell.fits is True:
        lines.append(f"fits on {cell.fits_devices} × {hardware_name} in {cell.fits_dtype or '?'}{mode}")
    elif cell.fits is False:
        lines.append(f"does not fit on {hardware_name} in {cell.fits_dtype or '?'}{mode}")
    if regressions:
        lines.append("open regression: " + ", ".join(regressions))
    if len(cell.engines) > 1 or not cell.default_engine:
        lines.append("engines: " + ", ".join(f"{ref} T{tier}" for ref, tier in cell.engines))
    return "\n".join(lines)


def engine_html(cell: CellView) -> str:
    """The engine line of a cell whose best engine is not the bundled runtime, or that has several engines: the
    one shown and a link to the cell page that lists every engine's tier."""
    if len(cell.engines) <= 1 and cell.default_engine:
        return ""
    others = len(cell.engines) - 1
    more = f" +{others}" if others > 0 else ""
    listed = escape(", ".join(f"{ref} T{tier}" for ref, tier in cell.engines))
    return f'<span class="engine" data-engines="{listed}">{escape(cell.engine)}{more}</span>'



def _fit_text(cell: CellView) -> str:
    mode = " emulated" if cell.quant_mode == "emulated" else ""  # a quantised format dequantised on this hardware
    if cell.fits is True:
        return f"fits {cell.fits_devices}× · {dtype_short(cell.fits_dtype)}{mode}"
    if cell.fits is False:
        return f"no fit · {dtype_short(cell.fits_dtype)}{mode}"
    return "fit unknown"


def evidence_marks(cell: CellView) -> str:
    """Marks on a tested cell: a claim the portal's verdict refutes, a tier on custom (looser) thresholds, a tier
    on synthetic (seeded) evidence."""
    marks = []
    if cell.disputed:
        marks.append(f'<span class="disputed" title="the agent claimed what the portal\'s verdict refutes">'
                     f'claim refuted: {escape(", ".join(cell.disputed))}</span>')
    if cell.custom_thresholds and cell.tier:
        marks.append('<span class="custom-thresholds" title="reached with thresholds looser than the defaults">'
                     'custom thresholds</span>')
    if cell.synthetic and cell.tier:
        marks.append('<span class="synthetic" title="seeded evidence, not an agent run">synthetic</span>')
    return "".join(marks)


def cell_html(model_slug: str, hardware_slug: str, cell: CellView | None, hardware_name: str = "", *,
              released_at: datetime | None = None, regressions: list[str] | None = None) -> str:
    """One ``<td>``. Untested: the fit and its format on one muted line. Tested: the tier, the date the current
    tier was reached and its signed lead time, "failed at", an open-regression flag; every tier's date in the
    tooltip. Slugs arrive already HTML-escaped; the name does not."""
    if cell is None:
        return '<td class="cell tier-none">—</td>'
    regressions = regressions or []
    times = reached_times(cell.tier_reached) if cell.tier_reached else {}
    title = escape(cell_title(cell, hardware_name, released_at, regressions, times))
    href = f"/cells/{model_slug}/{hardware_slug}/" + ("" if cell.default_engine else f"?engine={quote(cell.engine)}")
    engine = engine_html(cell)
    engine_attr = "" if cell.default_engine else f' data-engine="{escape(cell.engine)}"'
    flag = (f'<span class="reg-open" title="open regression: {escape(", ".join(regressions))}">▲ regression</span>'
            if regressions else "")
    if cell.tier == 0 and not cell.failed_stage:
        fit = " no-fit" if cell.fits is False else ""
        return (f'<td class="cell untested{fit}" data-tier="0"{engine_attr} title="{title}"><a href="{href}">'
                f'<span class="fit-line">{escape(_fit_text(cell))}</span>{engine}{flag}</a></td>')
    parts = [f'<span class="tier-label">T{cell.tier} {TIER_NAMES[cell.tier]}</span>']
    if cell.failed_stage:
        at = "" if cell.failed_stage in ("cancelled", "lost") else "at "
        parts.append(f'<span class="failed">✗ {at}{escape(cell.failed_stage)}</span>')
    when = times.get(cell.tier, cell.reached_at) if cell.tier else None
    if when is not None:
        lead = human_hours(lead_hours(when, released_at) if released_at else cell.lead_hours)
        w = _utc(when)
        parts.append(f'<span class="since"><time datetime="{when.isoformat()}">'
                     f'{w.day:02d} {MONTHS[w.month]} {w.year % 100:02d}</time>'
                     + (f' <span class="lead">{lead}</span>' if lead else "") + "</span>")
    parts.append(engine)
    parts.append(flag)
    parts.append(evidence_marks(cell))
    failed = " failed-cell" if cell.failed_stage else ""
    regressed = " regressed" if regressions else ""
    return (f'<td class="cell tier-{cell.tier}{failed}{regressed}" data-tier="{cell.tier}"{engine_attr} title="{title}">'
            f'<a href="{href}">{"".join(parts)}</a></td>')


def rows_html(models: list[ModelRelease], hardware: list[Hardware], cells: dict[tuple[int, int], CellView],
              regressions: dict[tuple[str, str], list[str]] | None = None) -> list[str]:
    """The cells of every model row, as HTML (one string per row); ``regressions``: the open ones per
    (model slug, hardware slug)."""
    columns = [(hw.pk, hw.slug, escape(hw.slug), hw.name) for hw in hardware]
    regressions = regressions or {}
    out = []
    for model in models:
        model_id, model_slug = model.pk, escape(model.slug)
        out.append("".join(cell_html(model_slug, slug_e, cells.get((model_id, hw_id)), name,
                                     released_at=model.released_at, regressions=regressions.get((model.slug, slug)))
                           for hw_id, slug, slug_e, name in columns))
    return out
