"""The conformance stage's reference: ``transformers`` on the same checkpoint (fp32, greedy), the prompt rendered
by the tokenizer's own ``apply_chat_template(tools=…)``, the generated text read by the same tool-call and
reasoning parsers the bundled server uses (chosen from the same template)."""

from __future__ import annotations

from typing import Any

import torch

from agents.pipeline.support.context import StageContext
from agents.pipeline.support.lm_backends import cache_of
from agents.pipeline.support.models import eos_token_ids, reference_model, tokenizer
from agents.runtime.server.chat_output import ChatSettings, read_text
from agents.runtime.server.reasoning import detect_reasoning
from agents.runtime.server.tool_parsers import PARSERS, detect
from agents.runtime.server.tools import tool_request


class Reference:
    """Greedy answers of the reference model to chat requests, parsed as the server parses them."""

    def __init__(self, ctx: StageContext) -> None:
        self.ctx = ctx
        self.tok = tokenizer(ctx)
        if self.tok is None or not getattr(self.tok, "chat_template", None):
            raise ValueError("the model's tokenizer has no chat template")
        template = self.tok.chat_template if isinstance(self.tok.chat_template, str) else str(self.tok.chat_template)
        self.parser = detect(template)
        self.reasoning = detect_reasoning(template)
        self.eos = eos_token_ids(ctx)

    def prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        """The prompt the template renders (the text, then its tokens: the template writes the special tokens)."""
        text = self.tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    @torch.no_grad()
    def generate(self, ids: list[int], max_tokens: int) -> list[int]:
        """Greedy tokens after ``ids`` (KV cache kept), ending at an end-of-sequence token or ``max_tokens``."""
        model = reference_model(self.ctx)
        out = model(input_ids=torch.tensor([ids]), use_cache=True)
        tokens: list[int] = []
        while len(tokens) < max_tokens:
            token = int(out.logits[0, -1].argmax())
            if token in self.eos:
                break
            tokens.append(token)
            out = model(input_ids=torch.tensor([[token]]), use_cache=True, **cache_of(out))
        return tokens

    def answer(self, messages: list[dict[str, Any]], body: dict[str, Any], max_tokens: int) -> dict[str, Any]:
        """``{text, calls, errors, prompt_tokens}`` of the reference's greedy answer to a request ``body``."""
        tools = body.get("tools")
        ids = self.prompt_ids(messages, tools)
        text = self.tok.decode(self.generate(ids, max_tokens), skip_special_tokens=False)
        settings = ChatSettings(tool_request(body), PARSERS.get(self.parser) if self.parser else None, self.reasoning)
        msg = read_text(settings, text)
        return {"text": text, "calls": msg.calls, "errors": msg.errors, "prompt_tokens": len(ids)}
