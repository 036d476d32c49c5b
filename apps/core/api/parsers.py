"""The API's JSON parser: DRF's strict parser (no NaN/Infinity), plus the refusals that keep bad bodies from
reaching a view as a 500: NUL characters and lone UTF-16 surrogates (``\\ud800``), which PostgreSQL cannot store
in text or jsonb, and nesting deeper than ``MAX_JSON_DEPTH`` (Python's parser would raise RecursionError near
1,000 levels, and every later walk of the document is recursive too)."""

from __future__ import annotations

import codecs
import json
import re
from itertools import accumulate
from typing import Any

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

MAX_JSON_DEPTH = 64
_ESCAPE = re.compile(rb"\\.", re.DOTALL)
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'[]{}"')
_STEP = {0x5B: 1, 0x7B: 1, 0x5D: -1, 0x7D: -1}  # [ { ] }
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def json_depth(raw: bytes) -> int:
    """The deepest nesting of arrays and objects in a JSON text (brackets inside strings do not count). Linear and
    at C speed but for the last count: escapes are dropped (so every quote left delimits a string), then only
    brackets and quotes kept, then every other quote-separated piece (the strings) dropped."""
    if raw.count(b"[") + raw.count(b"{") <= MAX_JSON_DEPTH:
        return MAX_JSON_DEPTH
    unescaped = _ESCAPE.sub(b"", raw) if b"\\" in raw else raw
    outside = b"".join(unescaped.translate(None, _NOT_STRUCTURE).split(b'"')[::2])
    return max(accumulate(map(_STEP.__getitem__, outside)), default=0)


def surrogate_path(value: Any, path: str = "") -> str | None:
    """The path (``events[0].message``) of the first string or key holding a lone surrogate, else None."""
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        item, at = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return at or "(the body)"
        elif isinstance(item, dict):
            for key, child in item.items():
                key_at = f"{at}.{key}" if at else str(key)
                try:
                    key.encode("utf-8")
                except UnicodeEncodeError:
                    return (at + "." if at else "") + key.encode("utf-8", "backslashreplace").decode()
                stack.append((child, key_at))
        elif isinstance(item, list):
            stack.extend((child, f"{at}[{i}]") for i, child in enumerate(item))
    return None


class StrictJSONParser(JSONParser):
    def parse(self, stream: Any, media_type: str | None = None, parser_context: dict | None = None) -> Any:
        parser_context = parser_context or {}
        encoding = parser_context.get("encoding", settings.DEFAULT_CHARSET)
        raw = stream.read() if stream is not None else b""
        if b"\\u0000" in raw or b"\x00" in raw:
            raise ParseError("JSON parse error - strings must not contain NUL (\\u0000) characters")
        if json_depth(raw) > MAX_JSON_DEPTH:
            raise ParseError(f"JSON parse error - the document nests arrays and objects deeper than "
                             f"{MAX_JSON_DEPTH} levels")
        try:
            text = codecs.decode(raw, encoding)
            data = json.loads(text, parse_constant=_reject_constant)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            raise ParseError(f"JSON parse error - {exc}") from exc
        if _SURROGATE_ESCAPE.search(raw):
            where = surrogate_path(data)
            if where is not None:
                raise ParseError(f"JSON parse error - {where} holds a lone UTF-16 surrogate (such as \\ud800): "
                                 "text must be valid Unicode")
        return data


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")
