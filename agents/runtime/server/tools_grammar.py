"""Forced tool calls: the llguidance grammar that makes a ``tool_choice`` of ``required`` or a named function hold
while decoding. Each tool-call format gets a wrapper grammar around the tools' JSON schemas (``%json`` inside
Lark), so the text the model writes is exactly the format its parser reads, with arguments valid for their
schema; markers that are one special token of the served tokenizer are written in llguidance's token syntax
(``<[id]>``), the others as text. ``auto`` stays unconstrained (the call is judged after generation).

Where the template opens a thinking block in the prompt (``deepseek_r1``) the answer first closes it, and where
the model may open one itself (``qwen3``) it may; the reasoning is bounded (``reasoning_budget`` characters, a
quarter of ``max_tokens``) so that the forced call always has room."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from agents.runtime.engine.grammar import GrammarError, grammar_from_lark
from agents.runtime.server.errors import APIError
from agents.runtime.server.tools import ToolRequest

# JSON written as json.dumps writes it (the form the parsers' tests and the templates use), no free whitespace
JSON_STYLE = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", ", "coerce_one_of": True}
OPEN, CLOSE = "<think>", "</think>"

KIMI_MAX_CALLS = 8  # parallel calls a forced Kimi-K2 answer may make (each call's index is in the grammar)
NEWLINE = '"\\n"'  # the Lark literal of a newline
Literal = Callable[[str], str]  # a marker's text -> its Lark form (a quoted string, or <[id]> for a special token)


def params_schema(function: dict[str, Any]) -> dict[str, Any]:
    """The function's ``parameters`` (an object with any fields when it has none), styled for the grammar."""
    schema = dict(function.get("parameters") or {"type": "object", "properties": {}})
    return {**schema, "x-guidance": JSON_STYLE}


def _json(schema: dict[str, Any]) -> str:
    return "%json " + json.dumps({**schema, "x-guidance": JSON_STYLE})


def _named(tools: ToolRequest) -> list[str]:
    return [tools.choice] if tools.named else list(tools.schemas)


def _object_call(name: str, function: dict[str, Any], args_key: str) -> dict[str, Any]:
    params = {k: v for k, v in params_schema(function).items() if k != "x-guidance"}
    return {"type": "object", "properties": {"name": {"const": name}, args_key: params},
            "required": ["name", args_key], "additionalProperties": False}


def _calls(rule: str, sep: str, parallel: bool) -> str:
    return f"{rule} ({sep} {rule})*" if parallel else rule


def _hermes(tools: ToolRequest, lit: Literal, template: str) -> list[str]:
    rules = [f"call: {lit('<tool_call>')} \"\\n\" call_json \"\\n\" {lit('</tool_call>')}",
             "call_json: " + " | ".join(f"c{i}" for i in range(len(_named(tools))))]
    rules += [f"c{i}: {_json(_object_call(n, tools.schemas[n], 'arguments'))}" for i, n in enumerate(_named(tools))]
    return ["calls: " + _calls("call", NEWLINE, tools.parallel), *rules]


def _llama3(tools: ToolRequest, lit: Literal, template: str) -> list[str]:
    rules = ["call: " + " | ".join(f"c{i}" for i in range(len(_named(tools))))]
    rules += [f"c{i}: {_json(_object_call(n, tools.schemas[n], 'parameters'))}" for i, n in enumerate(_named(tools))]
    return ["calls: " + _calls("call", '"; "', tools.parallel), *rules]


def _mistral(tools: ToolRequest, lit: Literal, template: str) -> list[str]:
    names = _named(tools)
    if "[ARGS]" in template:  # v11 and later: [TOOL_CALLS]name[ARGS]{...} per call
        rules = ["call: " + " | ".join(f"c{i}" for i in range(len(names)))]
        rules += [f"c{i}: {lit('[TOOL_CALLS]')} {json.dumps(n)} {lit('[ARGS]')} {_json(params_schema(tools.schemas[n]))}"
                  for i, n in enumerate(names)]
        return [f"calls: {_calls('call', '', tools.parallel)}", *rules]
    items = {"anyOf": [_object_call(n, tools.schemas[n], "arguments") for n in names]}
    array = {"type": "array", "items": items, "minItems": 1, **({} if tools.parallel else {"maxItems": 1})}
    return [f"calls: {lit('[TOOL_CALLS]')} {_json(array)}"]


def _deepseek_v3(tools: ToolRequest, lit: Literal, template: str) -> list[str]:
    names = _named(tools)
    v3 = "function<｜tool▁sep｜>" in template or not template  # V3/R1: a type, the name, fenced JSON; V3.1: name, JSON
    rules = ["call: " + " | ".join(f"c{i}" for i in range(len(names)))]
    for i, n in enumerate(names):
        args = _json(params_schema(tools.schemas[n]))
        head = f"{lit('<｜tool▁call▁begin｜>')} "
        if v3:
            body = f"\"function\" {lit('<｜tool▁sep｜>')} {json.dumps(n + chr(10) + '```json' + chr(10))} {args} \"\\n```\""
        else:
            body = f"{json.dumps(n)} {lit('<｜tool▁sep｜>')} {args}"
        rules.append(f"c{i}: {head}{body} {lit('<｜tool▁call▁end｜>')}")
    return [f"calls: {lit('<｜tool▁calls▁begin｜>')} {_calls('call', '', tools.parallel)} "
            f"{lit('<｜tool▁calls▁end｜>')}", *rules]


def _kimi_k2(tools: ToolRequest, lit: Literal, template: str) -> list[str]:
    """Each call's id is ``functions.NAME:I`` with I its position, so the calls are unrolled (at most
    ``KIMI_MAX_CALLS``)."""
    names = _named(tools)
    count = KIMI_MAX_CALLS if tools.parallel else 1
    rules = [f"k{j}: " + " | ".join(f"k{j}c{i}" for i in range(len(names))) for j in range(count)]
    rules += [f"k{j}c{i}: {lit('<|tool_call_begin|>')} {json.dumps(f'functions.{n}:{j}')} "
              f"{lit('<|tool_call_argument_begin|>')} {_json(params_schema(tools.schemas[n]))} "
              f"{lit('<|tool_call_end|>')}" for j in range(count) for i, n in enumerate(names)]
    chain = "k0" + "".join(f" (k{j}" for j in range(1, count)) + ")?" * (count - 1)
    return [f"calls: {lit('<|tool_calls_section_begin|>')} {chain} {lit('<|tool_calls_section_end|>')}", *rules]


FORMATS: dict[str, Callable[[ToolRequest, Literal, str], list[str]]] = {
    "hermes": _hermes, "mistral": _mistral, "llama3_json": _llama3, "deepseek_v3": _deepseek_v3,
    "kimi_k2": _kimi_k2,
}


def forces(tools: ToolRequest) -> bool:
    """The choice is forced while decoding: ``required`` or a named function."""
    return bool(tools.tools) and (tools.choice == "required" or tools.named)


def forced_call_lark(parser_name: str, tools: ToolRequest, lit: Literal, *, template: str = "",
                     reasoning: str | None = None, reasoning_budget: int = 0) -> str:
    """The Lark grammar of an answer that is only the forced call(s) in ``parser_name``'s format (after the
    reasoning where the model thinks); ValueError for a format without a grammar."""
    if parser_name not in FORMATS:
        raise ValueError(f"no forced-call grammar for the {parser_name!r} tool-call format")
    if tools.named:  # a named function is called once (as OpenAI and vLLM force it)
        tools = replace(tools, parallel=False)
    rules = FORMATS[parser_name](tools, lit, template or "")
    # the reasoning ends at the first closing marker (a lazy lexeme), and the marker is forced once the budget
    # of characters is spent
    think = ["reason: think_text /\\n{0,2}/",
             f"think_text[lazy]: /(.|\\n){{0,{max(1, reasoning_budget)}}}/ {lit(CLOSE)}"]
    if reasoning == "deepseek_r1":  # the prompt opened the block: close it first
        start = "start: reason calls"
    elif reasoning == "qwen3":  # the model may open one
        start = f"start: (/\\n*/ {lit(OPEN)} reason)? calls"
    else:
        start, think = "start: calls", []
    return "\n".join(["%llguidance {}", start, *rules, *think]) + "\n"


def forced_call_grammar(engine: Any, parser_name: str, tools: ToolRequest, *, reasoning: str | None,
                        max_tokens: int) -> str:
    """The compiled grammar of the forced call(s) for the served ``engine`` (its tokenizer decides which
    markers are special tokens); a 400 naming ``tools`` when a schema cannot be compiled."""
    lark = forced_call_lark(parser_name, tools, engine.grammar.literal,
                            template=engine.tokenizer.chat_template or "", reasoning=reasoning,
                            reasoning_budget=max_tokens // 4)
    try:
        return grammar_from_lark(lark)
    except GrammarError as exc:
        raise APIError(400, f"the tools' schemas cannot force a call: {exc}", "tools") from None
