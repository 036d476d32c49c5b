"""Reasoning split from the answer for models that think in ``<think>`` ... ``</think>``. ``deepseek_r1``: the
template opens the block in the prompt, so the text up to ``</think>`` is reasoning (all of it when the block
never closes); ``qwen3``: reasoning only when the text opens a block (or closes one the template opened), else
the whole text is the answer (``enable_thinking: false``). Applied to a partial text, the split holds back what
may still turn out to be a marker, so each partial split is a prefix of the final one."""

from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"
REASONING_PARSERS = ("deepseek_r1", "qwen3", "none")


def detect_reasoning(template: str | None) -> str | None:
    """The reasoning parser a template calls for: one that writes ``<think>`` into the prompt (DeepSeek-R1) or
    knows both markers (Qwen3's), else None."""
    if not template or CLOSE not in template:
        return None
    if "enable_thinking" in template:
        return "qwen3"
    return "deepseek_r1"


def _partial(text: str, marker: str) -> int:
    """Trailing characters of ``text`` that could begin ``marker``."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def split_reasoning(kind: str | None, text: str, final: bool) -> tuple[str | None, str]:
    """(reasoning or None, the rest) of ``text``; ``final`` False: what is safe to show of a partial text."""
    if kind in (None, "none"):
        return None, text
    head = text.lstrip()
    opened = head.startswith(OPEN)
    if opened:
        head = head[len(OPEN):]
    elif not final and head and OPEN.startswith(head):
        return "", ""  # perhaps the opening marker, still arriving
    if CLOSE in head:
        reasoning, rest = head.split(CLOSE, 1)
        return reasoning.lstrip("\n"), rest.lstrip()
    if kind == "qwen3" and not opened:
        return None, text
    reasoning = head.lstrip("\n")
    if not final:
        reasoning = reasoning[:len(reasoning) - _partial(reasoning, CLOSE)]
    return reasoning, ""
