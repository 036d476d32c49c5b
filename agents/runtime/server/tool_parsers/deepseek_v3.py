"""DeepSeek-V3/R1: ``<｜tool▁calls▁begin｜>`` then per call ``<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n
{...}\\n```<｜tool▁call▁end｜>`` (V3, R1), or ``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>`` (V3.1 and
later), then ``<｜tool▁calls▁end｜>``."""

from __future__ import annotations

import re
from typing import Any

from agents.runtime.server.tool_parsers.base import ToolParser, load_json

BEGIN, END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL = re.compile(r"<｜tool▁call▁begin｜>(.*?)<｜tool▁sep｜>(.*?)<｜tool▁call▁end｜>", re.DOTALL)
NAME = r"[A-Za-z0-9_.\-]{1,64}"
FENCED = re.compile(r"^(.*?)\n```(?:json)?\n(.*)\n```$", re.DOTALL)


class DeepSeekV3Parser(ToolParser):
    name = "deepseek_v3"
    markers = (BEGIN,)
    tokens = (BEGIN, END, "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>")
    head = re.compile(rf"<｜tool▁call▁begin｜>(?:function<｜tool▁sep｜>(?P<name>{NAME})\n```json\n|"
                      rf"(?!function<｜tool▁sep｜>)(?P<name2>{NAME})<｜tool▁sep｜>)")

    def parse_calls(self, text: str) -> list[tuple[str, Any]]:
        body = text[len(BEGIN):]
        if END in body:
            body, tail = body.split(END, 1)
            if tail.strip():
                raise ValueError("text after <｜tool▁calls▁end｜>")
        found = CALL.findall(body)
        if not found or CALL.sub("", body).strip():
            raise ValueError("malformed <｜tool▁call▁begin｜>...<｜tool▁call▁end｜> section")
        pairs = []
        for i, (head, rest) in enumerate(found):
            fenced = FENCED.match(rest.strip())
            if head.strip() == "function" and fenced:  # V3: type, name, fenced JSON
                name, args = fenced.group(1).strip(), fenced.group(2)
            else:
                name, args = head.strip(), rest.strip()
            pairs.append((name, load_json(args, f"the arguments of tool call {i}")))
        return pairs
