"""``{% cell_stack_line model hardware %}``: the stack a cell's evidence came from, and "stale since" a change
of its hardware's stack (``templates/dashboards/_stack.html``)."""

from __future__ import annotations

from typing import Any

from django import template

from apps.evidence.models import StageResult
from apps.evidence.runtime_evidence import soak_device_memory
from apps.matrix.stacks import cell_stack

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


def _polyline(points: list[tuple[float, float]], width: int, height: int, pad: float = 4.0) -> str:
    """SVG polyline points scaled into ``width`` x ``height`` (y grows downwards), the values' range (min to
    max) filling the height less ``pad`` on each side: a slow memory growth of a few MiB on GiB shows as a
    slope, not a flat line along the top. A constant series is a line across the middle."""
    if not points:
        return ""
    t_min, t_max = min(t for t, _ in points), max(t for t, _ in points)
    v_min, v_max = min(v for _, v in points), max(v for _, v in points)
    t_span, v_span = (t_max - t_min) or 1.0, v_max - v_min
    inner = height - 2 * pad

    def y(v: float) -> float:
        return height / 2 if v_span == 0 else pad + inner - (v - v_min) / v_span * inner

    return " ".join(f"{(t - t_min) / t_span * width:.1f},{y(v):.1f}" for t, v in points)


@register.inclusion_tag("dashboards/_soak.html")
def cell_soak_card(model: Any, hardware: Any) -> dict[str, Any]:
    """The newest soak evidence of a cell: its verdict, throughput and memory over time, recovery."""
    if model is None or hardware is None or model.pk is None or hardware.pk is None:
        return {"soak": None}
    result = (StageResult.objects.filter(job__model_id=model.pk, job__hardware_id=hardware.pk, stage="soak")
              .order_by("-created_at", "-id").first())
    if result is None:
        return {"soak": None}
    windows = [w for w in result.section.get("windows") or [] if isinstance(w, dict)]

    def series(key: str) -> list[tuple[float, float]]:
        return [(float(w["t"]), float(w[key])) for w in windows
                if isinstance(w.get("t"), int | float) and isinstance(w.get(key), int | float)]

    rss = series("rss_bytes")
    # CUDA: torch's allocated bytes per window; none on CPU (the selector the cell API serves too)
    memory = soak_device_memory(result.job_id, windows, result.section.get("device_memory"))
    device = [(p["t"], float(p["allocated_bytes"])) for p in memory["windows"]] if memory else []
    return {"soak": result.section, "result": result, "windows": windows,
            "tok_line": _polyline(series("output_tok_s"), 300, 60), "rss_line": _polyline(rss, 300, 60),
            "rss_max_mib": max(v for _, v in rss) / 2**20 if rss else None,
            "rss_min_mib": min(v for _, v in rss) / 2**20 if rss else None,
            "tok_min": min((v for _, v in series("output_tok_s")), default=None),
            "device_min_mib": min(v for _, v in device) / 2**20 if device else None,
            "tok_max": max((v for _, v in series("output_tok_s")), default=None),
            "device_memory": memory if memory and memory["reported"] else None,
            "device_line": _polyline(device, 300, 60) if device else "",
            "device_max_mib": max(v for _, v in device) / 2**20 if device else None}
