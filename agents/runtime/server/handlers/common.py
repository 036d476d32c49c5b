"""What every handler shares: the server's state (``ServerState``), the engine once it is ready, a request body
read within its limit and checked for the served model, prompts tokenized off the event loop."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from agents.runtime.engine import LLMEngine
from agents.runtime.server.async_engine import AsyncEngine
from agents.runtime.server.errors import APIError
from agents.runtime.server.fields import parse_json
from agents.runtime.server.images import ImageLimits, ImageProcessor
from agents.runtime.server.middleware import DEFAULT_MAX_BODY_BYTES, read_body_limited
from agents.runtime.server.protocol import check_model
from agents.runtime.server.reasoning import detect_reasoning
from agents.runtime.server.tool_parsers import ToolParser, detect, parser_class

INLINE_PARSE_BYTES = 64 * 1024  # bodies above this are parsed in a worker thread, off the event loop


@dataclass
class ServerState:
    """One server's state, held by its app (``app.state.server``) and handed to every handler."""

    runtime: AsyncEngine
    model_name: str
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    image_limits: ImageLimits = field(default_factory=ImageLimits)
    started: float = field(default_factory=time.time)
    processors: dict[int, ImageProcessor | None] = field(default_factory=dict)  # per engine: its image processor
    tool_parser: str = "auto"  # a tool_parsers name, "auto" (from the chat template) or "none"
    reasoning_parser: str = "auto"  # deepseek_r1, qwen3, "auto" (from the chat template) or "none"
    kept_tokens: set[int] = field(default_factory=set)  # engines whose tokenizer keeps the tool-call tokens

    def chat_parsers(self, engine: LLMEngine) -> tuple[type[ToolParser] | None, str | None]:
        """The tool-call parser class and reasoning parser the served model's template calls for (or the
        server's flags name)."""
        template = engine.tokenizer.chat_template
        tool = detect(template) if self.tool_parser == "auto" else self.tool_parser
        reasoning = detect_reasoning(template) if self.reasoning_parser == "auto" else self.reasoning_parser
        parser = None if tool in (None, "none") else parser_class(tool)
        if parser is not None and id(engine) not in self.kept_tokens:  # once per engine: markers stay in text
            self.kept_tokens.add(id(engine))
            engine.tokenizer.keep_in_text(parser.tokens)
        return parser, reasoning

    def ready_engine(self) -> LLMEngine:
        """The engine; a 503 while it loads (or after it failed)."""
        if not self.runtime.ready:
            raise APIError(503, self.runtime.error or "the model is still loading", err_type="server_error")
        return self.runtime.engine

    def engine_if_ready(self) -> LLMEngine | None:
        return self.runtime.engine if self.runtime.ready else None


async def read_body(state: ServerState, request: Request) -> dict[str, Any]:
    raw = await read_body_limited(request, state.max_body_bytes)
    body = parse_json(raw) if len(raw) <= INLINE_PARSE_BYTES else await run_in_threadpool(parse_json, raw)
    check_model(body, state.model_name)
    return body


def check_chars(engine: LLMEngine, prompt: str, param: str) -> None:
    """A text too long to fit the context whatever its tokens is refused without tokenizing it."""
    bound = 4 * engine.tokenizer.max_token_chars * engine.max_model_len
    if len(prompt) > bound:
        raise APIError(400, f"{param} of {len(prompt)} characters cannot fit the model's context of "
                            f"{engine.max_model_len} tokens", param)


async def tokenize(engine: LLMEngine, prompt: str, param: str, add_special_tokens: bool = True) -> list[int]:
    """Token ids of a text prompt, in a worker thread (a long prompt must not stall ``/health``)."""
    check_chars(engine, prompt, param)
    return await run_in_threadpool(engine.tokenizer.encode, prompt, add_special_tokens)
