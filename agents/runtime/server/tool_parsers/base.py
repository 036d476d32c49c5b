"""What every tool-call format shares: a parsed call, the parse of a whole generated text (the content before
the calls, the calls, and the errors of the calls that were malformed), and the checks of a call against the
request's tools (a known function name, arguments a JSON object with the schema's required keys and types)."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,), "array": (list,),
    "object": (dict,), "null": (type(None),),
}


@dataclass
class ToolCall:
    name: str
    arguments: str  # a JSON object, as text (OpenAI's form)
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class ArgSpan:
    """Where a call's arguments lie in the text from the first marker on: its function's name, its id when
    the text writes one, the arguments' start and end (None while the JSON value is unfinished)."""

    name: str
    id: str | None
    start: int
    end: int | None


@dataclass
class Parsed:
    """``content``: the text outside the calls (the whole text when a call was malformed); ``errors``: what was
    wrong with each malformed call (then ``calls`` is empty: a half-valid answer is never passed on as valid)."""

    content: str
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class ToolParser:
    """One family's format. ``markers``: the texts that open a tool call (a streamed answer holds its text back
    from the first of them); ``parse_calls`` turns the text from the first marker on into (name, arguments) pairs
    or raises ValueError saying what is malformed."""

    name = ""
    markers: tuple[str, ...] = ()
    tokens: tuple[str, ...] = ()  # every token of the format, kept in the decoded text where it is special
    # the text just before a call's JSON arguments, its function's name in group "name" (or "name2" in a second
    # form) and an id in "id" where the format writes one:
    # how arguments are streamed as the model writes them
    head: re.Pattern[str] | None = None

    def find_start(self, text: str) -> int:
        """Where the first tool call starts in ``text``, or -1."""
        hits = [i for i in (text.find(m) for m in self.markers) if i >= 0]
        return min(hits) if hits else -1

    def held_back(self, text: str) -> int:
        """How many trailing characters of a partial text might be the start of a marker (not yet content)."""
        for n in range(min(len(text), max((len(m) for m in self.markers), default=0)), 0, -1):
            if any(m.startswith(text[-n:]) for m in self.markers):
                return n
        return 0

    def parse_calls(self, text: str) -> list[tuple[str, Any]]:
        raise NotImplementedError

    def make_id(self, name: str, index: int) -> str | None:
        return None  # the default: a fresh call_ id

    def new_id(self) -> str:
        """An id for a call whose text names none (a streamed call's id is sent before the call is finished)."""
        return self.make_id("", 0) or ToolCall("", "").id

    def arg_spans(self, text: str) -> list[ArgSpan]:
        """The calls in ``text`` (from the first marker on, possibly unfinished) whose name is written, each with
        where its arguments lie, in order; a call's head is looked for only after the previous call's end."""
        spans: list[ArgSpan] = []
        pos = 0
        while self.head is not None:
            match = self.head.search(text, pos)
            if match is None:
                break
            end = json_end(text, match.end())
            groups = match.groupdict()
            name = groups.get("name") or groups.get("name2") or ""  # a format with two forms names both
            spans.append(ArgSpan(name, groups.get("id"), match.end(), end))
            if end is None:
                break
            pos = end
        return spans

    def parse(self, text: str, tools: dict[str, dict[str, Any]]) -> Parsed:
        start = self.find_start(text)
        if start < 0:
            return Parsed(text)
        try:
            pairs = self.parse_calls(text[start:])
        except ValueError as exc:
            return Parsed(text, errors=[f"{self.name}: {exc}"])
        calls, errors = [], []
        for i, (name, args) in enumerate(pairs):
            problem = check_call(name, args, tools)
            if problem:
                errors.append(f"tool call {i}: {problem}")
                continue
            call = ToolCall(name, json.dumps(args, ensure_ascii=False))
            call.id = self.make_id(name, i) or call.id
            calls.append(call)
        if errors or not calls:
            return Parsed(text, errors=errors or [f"{self.name}: no tool call found after the marker"])
        return Parsed(text[:start], calls)


def json_end(text: str, pos: int) -> int | None:
    """The end of the JSON object or array that starts at ``text[pos]``, or None while it is unfinished (or
    is not one)."""
    if pos >= len(text) or text[pos] not in "{[":
        return None
    depth, in_string, i = 0, False, pos
    while i < len(text):
        c = text[i]
        if in_string:
            if c == "\\":
                i += 1
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


def load_json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{what} is not valid JSON ({exc.msg} at character {exc.pos})") from None


def check_call(name: Any, args: Any, tools: dict[str, dict[str, Any]]) -> str | None:
    """None when the call names a requested function and its arguments fit the schema's required keys and
    the types of its properties; else what is wrong."""
    if not isinstance(name, str) or name not in tools:
        return f"unknown function {name!r} (the request's tools: {', '.join(sorted(tools)) or 'none'})"
    if not isinstance(args, dict):
        return f"{name}: arguments must be a JSON object, got {type(args).__name__}"
    schema = tools[name].get("parameters") or {}
    missing = [k for k in schema.get("required", []) if k not in args]
    if missing:
        return f"{name}: missing required argument(s) {', '.join(missing)}"
    props = schema.get("properties") or {}
    for key, value in args.items():
        spec = props.get(key)
        if spec is None:
            if schema.get("additionalProperties") is False:
                return f"{name}: unexpected argument {key!r}"
            continue
        problem = _type_problem(value, spec)
        if problem:
            return f"{name}: argument {key!r} {problem}"
    return None


def _type_problem(value: Any, spec: dict[str, Any]) -> str | None:
    kinds = spec.get("type")
    if kinds is None:
        kinds_list: list[str] = []
    else:
        kinds_list = kinds if isinstance(kinds, list) else [kinds]
    if kinds_list and not any(_is(value, k) for k in kinds_list):
        return f"must be of type {'/'.join(kinds_list)}, got {json.dumps(value)[:60]}"
    if "enum" in spec and value not in spec["enum"]:
        return f"must be one of {json.dumps(spec['enum'])[:80]}"
    return None


def _is(value: Any, kind: str) -> bool:
    if kind in ("integer", "number") and isinstance(value, bool):
        return False
    if kind == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, JSON_TYPES.get(kind, (object,)))
