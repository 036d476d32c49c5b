"""OpenAI response bodies: whole responses and SSE chunks for completions and chat completions."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from agents.runtime.engine import RequestOutput
from agents.runtime.server.protocol import usage

DONE = "data: [DONE]\n\n"


def sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


class Renderer:
    """Shapes one request's outputs; subclasses say what a choice looks like."""

    prefix = "cmpl"
    kind = "text_completion"
    chunk_kind = "text_completion"

    def __init__(self, model: str) -> None:
        self.model = model
        self.id = f"{self.prefix}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())

    def body(self, kind: str, choices: list[dict[str, Any]], usage_: dict[str, int] | None = None) -> dict:
        out: dict[str, Any] = {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if usage_ is not None:
            out["usage"] = usage_
        return out

    def whole(self, text: str, final: RequestOutput) -> dict[str, Any]:
        return self.body(
            self.kind,
            [self.final_choice(text, final.finish_reason)],
            usage(final.num_prompt_tokens, final.num_output_tokens),
        )

    async def stream(self, outs: AsyncIterator[RequestOutput], with_usage: bool) -> AsyncIterator[str]:
        """One chunk per engine step that produced tokens, the finish reason on the last, then usage."""
        for chunk in self.opening():
            yield sse(self.body(self.chunk_kind, [chunk]))
        async for out in outs:
            if out.finish_reason == "error":
                yield sse({"error": {"message": out.error, "type": "server_error", "param": None, "code": 500}})
                break
            if out.new_token_ids or out.finished:
                yield sse(self.body(self.chunk_kind, [self.delta_choice(out.new_text, out.finish_reason)]))
            if out.finished and with_usage:
                yield sse(self.body(self.chunk_kind, [], usage(out.num_prompt_tokens, out.num_output_tokens)))
        yield DONE

    def opening(self) -> list[dict[str, Any]]:
        return []

    def final_choice(self, text: str, reason: str | None) -> dict[str, Any]:
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}

    def delta_choice(self, text: str, reason: str | None) -> dict[str, Any]:
        return self.final_choice(text, reason)


class ChatRenderer(Renderer):
    prefix = "chatcmpl"
    kind = "chat.completion"
    chunk_kind = "chat.completion.chunk"

    def opening(self) -> list[dict[str, Any]]:
        return [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}]

    def final_choice(self, text: str, reason: str | None) -> dict[str, Any]:
        message = {"role": "assistant", "content": text}
        return {"index": 0, "message": message, "logprobs": None, "finish_reason": reason}

    def delta_choice(self, text: str, reason: str | None) -> dict[str, Any]:
        return {"index": 0, "delta": {"content": text} if text else {}, "logprobs": None, "finish_reason": reason}
