"""CSV for the benchmark API (``?format=csv``): a list of flat dicts becomes a header row and one line each."""

from __future__ import annotations

import csv
import io
from typing import Any

from rest_framework.renderers import BaseRenderer


class CSVRenderer(BaseRenderer):
    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: dict | None = None) -> str:
        rows = data if isinstance(data, list) else [data] if isinstance(data, dict) else []
        if rows and set(rows[0]) == {"detail"}:
            rows = [{"error": rows[0]["detail"]}]
        out = io.StringIO()
        if rows:
            writer = csv.DictWriter(out, fieldnames=list(rows[0]), extrasaction="ignore", lineterminator="\n")
            writer.writeheader()
            for row in rows:
                writer.writerow({k: ("" if v is None else v) for k, v in row.items()})
        return out.getvalue()
