"""The API's JSON parser: DRF's strict parser (no NaN/Infinity), plus a refusal of NUL characters, which
PostgreSQL cannot store in text or jsonb (they would otherwise surface as a database error)."""

from __future__ import annotations

import codecs
import json
from typing import Any

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser


class StrictJSONParser(JSONParser):
    def parse(self, stream: Any, media_type: str | None = None, parser_context: dict | None = None) -> Any:
        parser_context = parser_context or {}
        encoding = parser_context.get("encoding", settings.DEFAULT_CHARSET)
        raw = stream.read() if stream is not None else b""
        if b"\\u0000" in raw or b"\x00" in raw:
            raise ParseError("JSON parse error - strings must not contain NUL (\\u0000) characters")
        try:
            text = codecs.decode(raw, encoding)
            return json.loads(text, parse_constant=_reject_constant)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ParseError(f"JSON parse error - {exc}") from exc


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")
