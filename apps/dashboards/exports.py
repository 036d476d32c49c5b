"""Matrix export rows (CSV and JSON), from the matrix selector the page and the API use."""

from __future__ import annotations

from typing import Any

from apps.matrix.selectors import Matrix

MATRIX_COLUMNS = ("model", "model_name", "family", "released_at", "visibility", "hardware", "vendor", "tier",
                  "tier_name", "failed_stage", "fits", "fits_devices", "fits_dtype", "reached_at", "lead_time_hours", "jobs",
                  "synthetic", "custom_thresholds", "disputed", "engine", "engines")


def matrix_rows(matrix: Matrix) -> list[dict[str, Any]]:
    """One row per model × hardware, models newest release first."""
    rows = []
    for m in matrix.models:
        for hw, cell in zip(matrix.hardware, matrix.row(m), strict=True):
            c = cell.as_dict() if cell is not None else {}
            rows.append({
                "model": m.slug, "model_name": m.name, "family": m.family,
                "released_at": m.released_at.isoformat() if m.released_at else None, "visibility": m.visibility,
                "hardware": hw.slug, "vendor": hw.vendor, "tier": c.get("tier", 0),
                "tier_name": c.get("tier_name", "untested"), "failed_stage": c.get("failed_stage"),
                "fits": c.get("fits"), "fits_devices": c.get("fits_devices"), "fits_dtype": c.get("fits_dtype"),
                "reached_at": c.get("reached_at"),
                "lead_time_hours": c.get("lead_time_hours"), "jobs": c.get("jobs", 0),
                "synthetic": c.get("synthetic", False), "custom_thresholds": c.get("custom_thresholds", False),
                "disputed": ",".join(c.get("disputed") or []),
                # the engine whose cell this is (the best one, or the ?engine= filter's), every engine's tier
                "engine": c.get("engine"),
                "engines": " ".join(f"{e['engine']}:T{e['tier']}" for e in c.get("engines") or []),
            })
    return rows
