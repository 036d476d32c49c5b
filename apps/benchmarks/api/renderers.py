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
        response = (renderer_context or {}).get("response")
        if response is not None and response.status_code >= 400 and isinstance(data, dict):
            # an error ({"detail": ...} or {param: [messages]}): one "error" column naming what was wrong
            rows = [{"error": f"{key}: {' '.join(map(str, v)) if isinstance(v, list) else v}"}
                    for key, v in data.items()]
            return csv_text(rows, ["error"])
        rows = data if isinstance(data, list) else [data] if isinstance(data, dict) else []
        return csv_text(rows, list(rows[0])) if rows else ""
