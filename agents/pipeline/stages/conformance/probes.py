"""The conformance stage's side of the wire: OpenAI chat requests to a served endpoint (any engine's), the
streamed deltas added up into one message, messages reduced to what must agree, and the checks of tool calls
and JSON answers against their schemas (``jsonschema``)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather forecast of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The current time in a timezone.",
    "parameters": {"type": "object", "properties": {"timezone": {"type": "string"}}}}}
TOOLS = [WEATHER, TIME]
ANSWER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "answer": {"type": "string"}},
                 "required": ["city", "answer"], "additionalProperties": False}
TIMEOUT = 300.0


class Endpoint:
    """A served OpenAI endpoint (``/v1/chat/completions``); ``model`` goes into every body (engines that serve
    several models want it)."""

    def __init__(self, url: str, model: str | None = None) -> None:
        self.url, self.model = url.rstrip("/"), model

    def _body(self, body: dict[str, Any]) -> dict[str, Any]:
        return {**({"model": self.model} if self.model else {}), **body}

    def raw(self, body: dict[str, Any]) -> httpx.Response:
        return httpx.post(f"{self.url}/v1/chat/completions", json=self._body(body), timeout=TIMEOUT)

    def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        r = self.raw(body)
        if r.status_code != 200:
            raise ValueError(f"HTTP {r.status_code}: {r.text[:300]}")
        return r.json()

    def stream(self, body: dict[str, Any]) -> dict[str, Any]:
        """The streamed answer's deltas added up into one choice ``{message, finish_reason}``."""
        msg: dict[str, Any] = {"content": "", "reasoning_content": "", "calls": {}}
        finish = None
        with httpx.stream("POST", f"{self.url}/v1/chat/completions", json=self._body({**body, "stream": True}),
                          timeout=TIMEOUT) as r:
            if r.status_code != 200:
                raise ValueError(f"HTTP {r.status_code} streaming: {r.read()[:300]!r}")
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                for choice in json.loads(line[6:]).get("choices") or []:
                    delta = choice.get("delta") or {}
                    msg["content"] += delta.get("content") or ""
                    msg["reasoning_content"] += delta.get("reasoning_content") or ""
                    for call in delta.get("tool_calls") or []:
                        slot = msg["calls"].setdefault(call.get("index", 0), {"name": "", "arguments": ""})
                        fn = call.get("function") or {}
                        slot["name"] += fn.get("name") or ""
                        slot["arguments"] += fn.get("arguments") or ""
                    finish = choice.get("finish_reason") or finish
        calls = [msg["calls"][i] for i in sorted(msg["calls"])]
        tool_calls = [{"function": c} for c in calls]
        return {"message": {"content": msg["content"], "reasoning_content": msg["reasoning_content"],
                            "tool_calls": tool_calls}, "finish_reason": finish}


def _arguments(text: Any) -> Any:
    try:
        return json.loads(text) if isinstance(text, str) else text
    except ValueError:
        return text  # compared as given: a streamed call whose arguments do not parse still differs


def normal(choice: dict[str, Any]) -> dict[str, Any]:
    """What a streamed and a non-streamed answer must agree on: content, reasoning, tool calls (name and
    parsed arguments, ids aside) and the finish reason."""
    message = choice.get("message") or {}
    calls = [(c.get("function") or {}) for c in message.get("tool_calls") or []]
    return {"content": message.get("content") or "", "reasoning_content": message.get("reasoning_content") or "",
            "tool_calls": [{"name": c.get("name"), "arguments": _arguments(c.get("arguments"))} for c in calls],
            "finish_reason": choice.get("finish_reason")}


def call_problem(call: dict[str, Any], tools: list[dict[str, Any]], name: str | None = None) -> str | None:
    """Why a returned tool call is not a valid call of one of ``tools`` (of ``name`` when forced), or None."""
    fn = call.get("function") if isinstance(call.get("function"), dict) else call
    schemas = {t["function"]["name"]: t["function"].get("parameters") or {} for t in tools}
    called = fn.get("name")
    if called not in schemas:
        return f"unknown function {called!r}"
    if name is not None and called != name:
        return f"called {called!r}, {name!r} was forced"
    try:
        args = json.loads(fn.get("arguments")) if isinstance(fn.get("arguments"), str) else fn.get("arguments")
        jsonschema.validate(args, schemas[called])
    except ValueError as exc:
        return f"{called}: arguments are not JSON ({exc})"
    except jsonschema.ValidationError as exc:
        return f"{called}: {exc.message}"
    return None


def schema_problem(text: str | None, schema: dict[str, Any]) -> str | None:
    """Why an answer is not valid JSON of ``schema``, or None."""
    try:
        jsonschema.validate(json.loads(text or ""), schema)
    except ValueError as exc:
        return f"not JSON ({exc})"
    except jsonschema.ValidationError as exc:
        return exc.message
    return None


def tool_errors(choice: dict[str, Any]) -> list[str]:
    """The server's own report of a call it could not pass on (the bundled runtime's ``day0_tool_call_errors``)."""
    errors = choice.get("day0_tool_call_errors")
    return [str(e) for e in errors] if isinstance(errors, list) else []


def error_shape(response: httpx.Response) -> dict[str, Any]:
    """A refused request's status and the keys of its ``error`` object."""
    try:
        error = response.json().get("error")
    except (ValueError, AttributeError):
        error = None
    return {"status": response.status_code, "error_keys": sorted(error) if isinstance(error, dict) else []}
