"""Kimi-K2: ``<|tool_calls_section_begin|>`` then per call ``<|tool_call_begin|>functions.NAME:INDEX
<|tool_call_argument_begin|>{...}<|tool_call_end|>``, then ``<|tool_calls_section_end|>``; the call's id is its
``functions.NAME:INDEX`` (Kimi's templates read it back)."""

from __future__ import annotations

import re
from typing import Any

from agents.runtime.server.tool_parsers.base import ToolParser, load_json

BEGIN, END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL = re.compile(r"<\|tool_call_begin\|>(.*?)<\|tool_call_argument_begin\|>(.*?)<\|tool_call_end\|>", re.DOTALL)
CALL_ID = re.compile(r"^(?:functions\.)?([\w.\-]+):(\d+)$")


class KimiK2Parser(ToolParser):
    name = "kimi_k2"
    markers = (BEGIN,)
    tokens = (BEGIN, END, "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>")
    head = re.compile(r"<\|tool_call_begin\|>(?P<id>functions\.(?P<name>[A-Za-z0-9_.\-]{1,64}):\d+)"
                      r"<\|tool_call_argument_begin\|>")

    def __init__(self) -> None:
        self._ids: dict[int, str] = {}

    def parse_calls(self, text: str) -> list[tuple[str, Any]]:
        body = text[len(BEGIN):]
        if END in body:
            body, tail = body.split(END, 1)
            if tail.strip():
                raise ValueError("text after <|tool_calls_section_end|>")
        found = CALL.findall(body)
        if not found or CALL.sub("", body).strip():
            raise ValueError("malformed <|tool_call_begin|>...<|tool_call_end|> section")
        pairs, self._ids = [], {}
        for i, (head, args) in enumerate(found):
            match = CALL_ID.match(head.strip())
            if match is None:
                raise ValueError(f"tool call {i}: id {head.strip()[:60]!r} is not functions.NAME:INDEX")
            self._ids[i] = head.strip()
            pairs.append((match.group(1), load_json(args.strip(), f"the arguments of tool call {i}")))
        return pairs

    def make_id(self, name: str, index: int) -> str | None:
        return self._ids.get(index)
