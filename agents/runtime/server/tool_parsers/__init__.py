"""Tool-call parsers, one module per format, and the registry: a parser by name (``--tool-call-parser``), or
chosen from the chat template's text (the tokens its tool-call section writes)."""

from __future__ import annotations

from agents.runtime.server.tool_parsers.base import Parsed, ToolCall, ToolParser, check_call
from agents.runtime.server.tool_parsers.deepseek_v3 import DeepSeekV3Parser
from agents.runtime.server.tool_parsers.hermes import HermesParser
from agents.runtime.server.tool_parsers.kimi_k2 import KimiK2Parser
from agents.runtime.server.tool_parsers.llama3_json import Llama3JsonParser
from agents.runtime.server.tool_parsers.mistral import MistralParser

PARSERS: dict[str, type[ToolParser]] = {
    "hermes": HermesParser,
    "qwen": HermesParser,
    "mistral": MistralParser,
    "llama3_json": Llama3JsonParser,
    "deepseek_v3": DeepSeekV3Parser,
    "kimi_k2": KimiK2Parser,
}
# (a text of the template, the parser it means), the most specific first
SIGNATURES: tuple[tuple[str, str], ...] = (
    ("<|tool_calls_section_begin|>", "kimi_k2"),
    ("<｜tool▁calls▁begin｜>", "deepseek_v3"),
    ("[TOOL_CALLS]", "mistral"),
    ("<tool_call>", "hermes"),
    ("<|python_tag|>", "llama3_json"),
    ('"parameters": dictionary of argument name', "llama3_json"),
)

__all__ = ["PARSERS", "Parsed", "ToolCall", "ToolParser", "check_call", "detect", "parser_class"]


def detect(template: str | None) -> str | None:
    """The parser a chat template's text calls for, or None (a template that declares no tool-call format)."""
    for text, name in SIGNATURES:
        if template and text in template:
            return name
    return None


def parser_class(name: str) -> type[ToolParser]:
    if name not in PARSERS:
        raise ValueError(f"unknown tool-call parser {name!r} (known: {', '.join(sorted(PARSERS))})")
    return PARSERS[name]
