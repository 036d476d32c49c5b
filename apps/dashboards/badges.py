"""SVG badges for READMEs: "<hardware> | T3 serves" with the tier's colour and its number and name in text."""

from __future__ import annotations

from html import escape

from contract.tiers import TIER_NAMES

# background, text colour per tier (the label always carries the number and name: never colour alone). The
# backgrounds are the portal's tier palette (--tier-N-line in static/css/day0.css; a test keeps them equal), the
# text the more legible of dark and white on each.
TIER_COLOURS: dict[int, tuple[str, str]] = {
    0: ("#9ca3af", "#111827"), 1: ("#6366f1", "#fff"), 2: ("#3b82f6", "#111827"), 3: ("#06b6d4", "#111827"),
    4: ("#10b981", "#111827"), 5: ("#f59e0b", "#111827"), 6: ("#064e3b", "#fff"),
}
FAILED = ("#b91c1c", "#fff")
LABEL_BG = "#374151"


def _text_width(text: str) -> int:
    """A width estimate for Verdana 11 px (wide letters count more); good enough for a badge."""
    wide = sum(1 for c in text if c in "MWmw@%")
    narrow = sum(1 for c in text if c in "iljtf.,:;|!' ")
    return int(6.4 * (len(text) - wide - narrow) + 9.5 * wide + 3.6 * narrow) + 12


def badge_svg(label: str, tier: int, failed_stage: str = "", marks: tuple[str, ...] = ()) -> str:
    """A flat two-part badge: ``label`` on grey, then "T<tier> <name>" (and "failed at <stage>"), then what the
    tier rests on when it is not the defaults' verdict on agent evidence ("custom thresholds", "synthetic",
    "disputed": ``day0.cell_marks``), in the text itself."""
    value = (f"T{tier} {TIER_NAMES[tier]}" + (f" · failed at {failed_stage}" if failed_stage else "")
             + "".join(f" · {mark}" for mark in marks))
    bg, fg = FAILED if failed_stage else TIER_COLOURS[tier]
    lw, vw = _text_width(label), _text_width(value)
    width = lw + vw
    title = (f"{label}: tier {tier} ({TIER_NAMES[tier]})" + (f", failed at {failed_stage}" if failed_stage else "")
             + (f"; {', '.join(marks)}" if marks else ""))
    label_e, value_e, title_e = escape(label), escape(value), escape(title)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="20" role="img" aria-label="{title_e}">'
        f"<title>{title_e}</title>"
        f'<clipPath id="r"><rect width="{width}" height="20" rx="3" fill="#fff"/></clipPath>'
        f'<g clip-path="url(#r)"><rect width="{lw}" height="20" fill="{LABEL_BG}"/>'
        f'<rect x="{lw}" width="{vw}" height="20" fill="{bg}"/></g>'
        f'<g text-anchor="middle" font-family="Verdana,DejaVu Sans,sans-serif" font-size="11">'
        f'<text x="{lw / 2:.1f}" y="14" fill="#fff">{label_e}</text>'
        f'<text x="{lw + vw / 2:.1f}" y="14" fill="{fg}">{value_e}</text></g></svg>'
    )
