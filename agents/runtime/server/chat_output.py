"""A chat choice's generated text as the API returns it: ``reasoning_content`` split off, tool calls parsed into
OpenAI ``tool_calls`` (checked against the request's tools), the rest as ``content``. Whole: ``message``.
Streamed: ``delta``s whose concatenation is exactly the whole message, because both run the same split: a
partial text shows only what cannot change (text that may begin a tool call or a marker is held back), and the
finished text is parsed once, as the whole response parses it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agents.runtime.server.reasoning import split_reasoning
from agents.runtime.server.tool_parsers import Parsed, ToolParser
from agents.runtime.server.tools import ToolRequest


@dataclass
class ChatSettings:
    """How a request's choices are read: the tool-call parser (None: tool calls are not parsed) and the
    reasoning parser (None: no reasoning split)."""

    tools: ToolRequest = field(default_factory=ToolRequest)
    tool_parser: type[ToolParser] | None = None
    reasoning: str | None = None
    forced: bool = False  # the calls are forced by a grammar while decoding (their arguments stream as written)

    def parses_tools(self) -> bool:
        return self.tools.parses and self.tool_parser is not None


@dataclass
class Message:
    reasoning: str | None
    content: str | None
    calls: list[dict[str, Any]]
    errors: list[str]


def read_text(settings: ChatSettings, text: str) -> Message:
    """The finished text of one choice, split and parsed."""
    reasoning, rest = split_reasoning(settings.reasoning, text, final=True)
    parsed = Parsed(rest)
    if settings.parses_tools():
        parser = settings.tool_parser()
        parsed = parser.parse(rest, settings.tools.schemas)
        parsed.errors += _choice_errors(settings.tools, parsed)
        if parsed.errors:
            parsed = Parsed(rest, errors=parsed.errors)
        elif settings.forced:
            _as_written(parser, rest, parsed)
    elif settings.tools.choice not in ("none", "auto"):
        parsed.errors.append("this server has no tool-call parser for the model's template "
                             "(start it with --tool-call-parser)")
    content = parsed.content if parsed.content.strip() or not parsed.calls else None
    return Message(reasoning, content, [c.openai() for c in parsed.calls], parsed.errors)


def _as_written(parser: ToolParser, rest: str, parsed: Parsed) -> None:
    """A forced call's arguments as the model wrote them (valid, as parsed), which is what streamed out piece by
    piece; kept as parsed where the text cannot be matched call for call."""
    start = parser.find_start(rest)
    spans = parser.arg_spans(rest[start:])
    if len(spans) != len(parsed.calls):
        return
    pairs = list(zip(spans, parsed.calls, strict=True))
    if any(span.end is None or span.name != call.name for span, call in pairs):
        return
    for span, call in pairs:
        call.arguments = rest[start + span.start:start + span.end]
        call.id = span.id or call.id


def _choice_errors(tools: ToolRequest, parsed: Parsed) -> list[str]:
    if parsed.errors:
        return []
    if tools.choice == "required" and not parsed.calls:
        return ["tool_choice is 'required' but the model made no tool call"]
    if tools.named and (not parsed.calls or any(c.name != tools.choice for c in parsed.calls)):
        return [f"tool_choice names {tools.choice!r} but the model called "
                f"{[c.name for c in parsed.calls] or 'no function'}"]
    if not tools.parallel and len(parsed.calls) > 1:
        return [f"parallel_tool_calls is false but the model made {len(parsed.calls)} calls"]
    return []


def message_fields(settings: ChatSettings, msg: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "assistant", "content": msg.content}
    if settings.reasoning not in (None, "none"):
        out["reasoning_content"] = msg.reasoning
    if msg.calls:
        out["tool_calls"] = msg.calls
    return out


class StreamedChoice:
    """One streamed choice: the text so far, and how much reasoning and content has gone out."""

    def __init__(self, settings: ChatSettings) -> None:
        self.settings = settings
        self.text = ""
        self.sent_reasoning = 0
        self.sent_content = 0
        self.sent_args: list[int] = []  # per call already opened (forced calls stream as written): arguments sent

    @staticmethod
    def _visible(full: str, sent: int, final: bool) -> str:
        return full[sent:] if final or full.strip() else ""  # whitespace alone waits: it may end up dropped

    def feed(self, new_text: str) -> dict[str, Any]:
        """The delta for a step's new text of an unfinished choice (possibly empty)."""
        self.text += new_text
        if self.settings.reasoning in (None, "none") and not self.settings.parses_tools():
            self.sent_content += len(new_text)  # plain text: every character is content as it comes
            return {"content": new_text} if new_text else {}
        reasoning, rest = split_reasoning(self.settings.reasoning, self.text, final=False)
        calls: list[dict[str, Any]] = []
        if self.settings.parses_tools():
            parser = self.settings.tool_parser()
            start = parser.find_start(rest)
            if start >= 0 and self.settings.forced:
                calls = self._call_deltas(parser, rest[start:])
            rest = rest[:start] if start >= 0 else rest[:len(rest) - parser.held_back(rest)]
        delta = self._delta(reasoning or "", rest)
        if calls:
            delta["tool_calls"] = calls
        return delta

    def _call_deltas(self, parser: ToolParser, text: str) -> list[dict[str, Any]]:
        """A forced call's pieces so far: its id and name once written, then its arguments as they grow (the
        grammar makes them valid; a call cut off by max_tokens is named in the final chunk's errors)."""
        out: list[dict[str, Any]] = []
        for i, span in enumerate(parser.arg_spans(text)):
            args = text[span.start:span.end if span.end is not None else len(text)]
            if i == len(self.sent_args):
                self.sent_args.append(0)
                out.append({"index": i, "id": span.id or parser.new_id(), "type": "function",
                            "function": {"name": span.name, "arguments": ""}})
            if len(args) > self.sent_args[i]:
                out.append({"index": i, "function": {"arguments": args[self.sent_args[i]:]}})
                self.sent_args[i] = len(args)
        return out

    def finish(self, new_text: str) -> tuple[list[dict[str, Any]], Message]:
        """The deltas that end the choice: the rest of its reasoning and content, then each tool call (its id,
        type and name with empty arguments, then its arguments)."""
        self.text += new_text
        msg = read_text(self.settings, self.text)
        deltas = [self._delta(msg.reasoning or "", msg.content or "", final=True)]
        for i, call in enumerate(msg.calls):
            function = call["function"]
            if i >= len(self.sent_args):
                self.sent_args.append(0)
                deltas.append({"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                                               "function": {"name": function["name"], "arguments": ""}}]})
            rest = function["arguments"][self.sent_args[i]:]
            if rest or not self.sent_args[i]:
                deltas.append({"tool_calls": [{"index": i, "function": {"arguments": rest}}]})
        return deltas, msg

    def _delta(self, reasoning: str, content: str, final: bool = False) -> dict[str, Any]:
        delta: dict[str, Any] = {}
        more = reasoning[self.sent_reasoning:]
        if more:
            delta["reasoning_content"] = more
            self.sent_reasoning = len(reasoning)
        more = self._visible(content, self.sent_content, final)
        if more:
            delta["content"] = more
            self.sent_content = len(content)
        return delta
