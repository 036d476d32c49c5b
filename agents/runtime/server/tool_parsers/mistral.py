"""Mistral: ``[TOOL_CALLS]`` then either a JSON list ``[{"name": ..., "arguments": {...}}, ...]`` (v3 tokenizers)
or ``name[ARGS]{...}`` per call, each after its own ``[TOOL_CALLS]`` (v11 and later). Call ids are 9
alphanumeric characters, as Mistral's templates require."""

from __future__ import annotations

import random
import re
import string
from typing import Any

from agents.runtime.server.tool_parsers.base import ToolParser, load_json

MARK, ARGS = "[TOOL_CALLS]", "[ARGS]"


class MistralParser(ToolParser):
    name = "mistral"
    markers = (MARK,)
    tokens = (MARK, ARGS)
    # a call of the JSON list, or name[ARGS] after its own [TOOL_CALLS]
    head = re.compile(r'(?:\{"name": "(?P<name>[A-Za-z0-9_.\-]{1,64})", "arguments": |\[TOOL_CALLS\]'
                      r'(?P<name2>[A-Za-z0-9_.\-]{1,64})\[ARGS\])')

    def parse_calls(self, text: str) -> list[tuple[str, Any]]:
        pieces = [p.strip() for p in text.split(MARK)[1:]]
        pairs: list[tuple[str, Any]] = []
        for piece in pieces:
            if piece.startswith("["):
                calls = load_json(piece, "the [TOOL_CALLS] list")
                if not isinstance(calls, list) or not all(isinstance(c, dict) and "name" in c for c in calls):
                    raise ValueError("[TOOL_CALLS] must hold a list of objects with a 'name'")
                pairs += [(c["name"], c.get("arguments", {})) for c in calls]
            elif ARGS in piece:
                name, args = piece.split(ARGS, 1)
                pairs.append((name.strip(), load_json(args.strip(), f"the arguments of {name.strip()!r}")))
            else:
                raise ValueError(f"[TOOL_CALLS] followed by neither a JSON list nor name[ARGS]: {piece[:40]!r}")
        return pairs

    def make_id(self, name: str, index: int) -> str | None:
        return "".join(random.choices(string.ascii_letters + string.digits, k=9))

