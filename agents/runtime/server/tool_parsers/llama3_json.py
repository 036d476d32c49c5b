"""Llama 3.1-3.3: a call is the JSON object ``{"name": ..., "parameters": {...}}`` (``arguments`` accepted too),
optionally after ``<|python_tag|>``; parallel calls separated by ``;``. The answer is a call only when it
starts with one (after whitespace): prose that mentions JSON stays content."""

from __future__ import annotations

import json
import re
from typing import Any

from agents.runtime.server.tool_parsers.base import ToolParser

TAG = "<|python_tag|>"


class Llama3JsonParser(ToolParser):
    name = "llama3_json"
    markers = (TAG, '{"name"')
    tokens = (TAG,)
    head = re.compile(r'\{"name": "(?P<name>[A-Za-z0-9_.\-]{1,64})", "parameters": ')

    def find_start(self, text: str) -> int:
        body = text.lstrip()
        if body.startswith(TAG) or body.startswith('{"name"') or body.startswith('{ "name"'):
            return len(text) - len(body)
        return -1

    def held_back(self, text: str) -> int:
        body = text.lstrip()
        if not body.strip():
            return len(text)
        if any(m.startswith(body) for m in (TAG, '{"name"', '{ "name"')):
            return len(text)
        return 0

    def parse_calls(self, text: str) -> list[tuple[str, Any]]:
        text = text.strip()
        if text.startswith(TAG):
            text = text[len(TAG):].strip()
        decoder = json.JSONDecoder()
        pairs, pos = [], 0
        while pos < len(text):
            try:
                obj, end = decoder.raw_decode(text, pos)
            except json.JSONDecodeError as exc:
                raise ValueError(f"tool call {len(pairs)} is not valid JSON ({exc.msg})") from None
            if not isinstance(obj, dict) or "name" not in obj:
                raise ValueError(f"tool call {len(pairs)} is not an object with a 'name'")
            pairs.append((obj["name"], obj.get("parameters", obj.get("arguments", {}))))
            pos = end
            while pos < len(text) and text[pos] in " \t\r\n;":
                pos += 1
        return pairs
