"""Qwen2.5/Qwen3 and Hermes templates: each call is ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``,
parallel calls one after another."""

from __future__ import annotations

import re
from typing import Any

from agents.runtime.server.tool_parsers.base import ToolParser, load_json

CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


class HermesParser(ToolParser):
    name = "hermes"
    markers = ("<tool_call>",)
    tokens = ("<tool_call>", "</tool_call>")
    head = re.compile(r'\{"name": "(?P<name>[A-Za-z0-9_.\-]{1,64})", "arguments": ')

    def parse_calls(self, text: str) -> list[tuple[str, Any]]:
        bodies = CALL.findall(text)
        rest = CALL.sub("", text).strip()
        if not bodies or rest:
            raise ValueError("text outside <tool_call>...</tool_call> or an unclosed <tool_call>")
        pairs = []
        for i, body in enumerate(bodies):
            obj = load_json(body.strip(), f"tool call {i}")
            if not isinstance(obj, dict) or "name" not in obj:
                raise ValueError(f"tool call {i} is not an object with a 'name'")
            pairs.append((obj["name"], obj.get("arguments", {})))
        return pairs
