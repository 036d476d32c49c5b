"""The portal's one navigation bar: its sections, and which one the current page belongs to."""

from __future__ import annotations

from django import template
from django.http import HttpRequest

register = template.Library()

# (href, label, the URL names whose pages belong to the section)
SECTIONS: tuple[tuple[str, str, frozenset[str]], ...] = (
    ("/", "Matrix", frozenset({"matrix-page", "cell-page", "model-page"})),
    ("/jobs/", "Jobs", frozenset({"jobs-page", "job-page"})),
    ("/hardware/", "Hardware", frozenset({"hardware-list", "hardware-page"})),
    ("/agents/", "Agents", frozenset({"agents-page"})),
    ("/regressions/", "Regressions", frozenset({"regressions-page", "compare-page"})),
    ("/trends/", "Trends", frozenset({"trends-page"})),
    ("/day0/", "Day-0 timeline", frozenset({"day0-page"})),
    ("/api/v1/", "API", frozenset()),
    ("/api/docs/", "API docs", frozenset()),
)


@register.simple_tag(takes_context=True)
def nav_sections(context: template.Context) -> list[dict[str, object]]:
    """[{href, label, current}] for the bar; ``current`` marks the section of the page being shown."""
    request: HttpRequest | None = context.get("request")
    match = getattr(request, "resolver_match", None)
    name = getattr(match, "url_name", None) or context.get("nav_section", "")
    return [{"href": href, "label": label, "current": name in names} for href, label, names in SECTIONS]
