"""``{% cell_stack_line model hardware %}``: the stack a cell's evidence came from, and "stale since" a change
of its hardware's stack (``templates/dashboards/_stack.html``)."""

from __future__ import annotations

from typing import Any

from django import template

from apps.alerts.stacks import cell_stack

register = template.Library()


@register.inclusion_tag("dashboards/_stack.html")
def cell_stack_line(model: Any, hardware: Any) -> dict[str, Any]:
    if model is None or hardware is None or model.pk is None or hardware.pk is None:
        return {"stack": None}
    stack = cell_stack(model.pk, hardware.pk)
    change = stack["stack_change"] or {}
    what = "; ".join(f"{k}: {change['before'].get(k, '?')} → {change['after'].get(k, '?')}"
                     for k in change.get("changed", []))
    return {"stack": stack, "change_text": what}
