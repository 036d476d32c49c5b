"""The ``conformance`` stage's contract (docs/stage-report.md): the checks it runs against a served OpenAI
endpoint, which of them a model owes (tool checks where its chat template declares tools, the reasoning check
where it thinks), and how to tell from a chat template's text that it declares tools. Pure: no torch, no Django.

Each check is a row ``{check, passed, detail, target, reference}``; ``contract.verdicts.conformance`` recomputes
every row's pass from its ``target`` and ``reference`` (never the row's own ``passed``)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

# the checks every served chat model owes ...
BASE_CHECKS: tuple[str, ...] = ("json_schema_valid", "stream_equals_whole", "prompt_tokens", "stop_honoured",
                                "n_honoured", "seed_determinism", "max_tokens_honoured", "error_shape")
# ... those a model whose template declares tools owes besides ...
TOOL_CHECKS: tuple[str, ...] = ("tool_trigger_agreement", "tool_arguments_valid", "forced_calls_valid")
# ... and the one a thinking model owes (its reasoning never in ``content``)
THINKING_CHECKS: tuple[str, ...] = ("reasoning_not_in_content",)
ALL_CHECKS: tuple[str, ...] = TOOL_CHECKS + BASE_CHECKS + THINKING_CHECKS

# a Jinja expression or statement that reads the ``tools`` variable transformers passes
_TOOLS_IN_JINJA = re.compile(r"\{[{%][^}]*?\btools\b", re.S)


def declares_tools(template: str | None) -> bool:
    """Whether a chat template's text reads ``tools`` (renders the tools a request passes)."""
    return bool(template) and _TOOLS_IN_JINJA.search(template) is not None


def template_text(source: Any) -> str | None:
    """The chat template text of a ``tokenizer_config.json``'s ``chat_template`` value (a string, or the
    list of named templates transformers also accepts: all of them read together)."""
    if isinstance(source, str):
        return source
    if isinstance(source, list):
        parts = [t.get("template") for t in source if isinstance(t, Mapping) and isinstance(t.get("template"), str)]
        return "\n".join(parts) or None
    return None


def required_checks(tools: bool, thinking: bool) -> tuple[str, ...]:
    """The checks a conformance section must show passing: the base ones, the tool ones where the template
    declares tools, the reasoning one for a thinking model."""
    return (TOOL_CHECKS if tools else ()) + BASE_CHECKS + (THINKING_CHECKS if thinking else ())
