"""CSV for the benchmark API (``?format=csv``): a list of flat dicts becomes a header row and one line each."""

from __future__ import annotations

from typing import Any

from rest_framework.renderers import BaseRenderer

from apps.core.csvfiles import csv_text


class CSVRenderer(BaseRenderer):
    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: dict | None = None) -> str:
        rows = data if isinstance(data, list) else [data] if isinstance(data, dict) else []
        if rows and set(rows[0]) == {"detail"}:
            rows = [{"error": rows[0]["detail"]}]
        return csv_text(rows, list(rows[0])) if rows else ""
