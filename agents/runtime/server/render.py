"""OpenAI response bodies: whole responses and SSE chunks for completions and chat completions, with one
choice per (prompt, n) and logprobs in each endpoint's format."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from agents.runtime.engine import RequestOutput
from agents.runtime.engine.outputs import TokenLogprob
from agents.runtime.server.chat_output import ChatSettings, Message, StreamedChoice, message_fields, read_text
from agents.runtime.server.errors import APIError
from agents.runtime.server.protocol import Generation, usage

DONE = "data: [DONE]\n\n"
LOGPROB_FLOOR = -9999.0  # JSON has no -inf: a token the model rules out gets this


def sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def _lp(value: float) -> float:
    return max(value, LOGPROB_FLOOR)


@dataclass
class Choice:
    """One choice of the response: which prompt it answers, and whether its prompt tokens count in usage
    (once per prompt, however many choices it has)."""

    index: int
    prompt_ids: list[int]
    prompt_text: str
    counts_prompt: bool


class Renderer:
    """Shapes one request's outputs (``(choice index, RequestOutput)`` pairs); subclasses say what a choice
    and its logprobs look like."""

    prefix = "cmpl"
    kind = "text_completion"
    chunk_kind = "text_completion"

    def __init__(
        self,
        model: str,
        request_id: str,
        gen: Generation,
        choices: list[Choice],
        token_text: Callable[[int], str],
        visible_len: Callable[[int], int],
    ) -> None:
        self.model = model
        self.id = f"{self.prefix}-{request_id}"
        self.created = int(time.time())
        self.gen = gen
        self.choices = choices
        self.token_text = token_text
        self.visible_len = visible_len
        self._logprobs: dict[int, LegacyLogprobs] = {}  # per streamed choice: its text offsets continue
        self._sent_ids: set[int] = set()  # streamed choices whose prompt_token_ids went out

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

    def usage(self, finals: dict[int, RequestOutput]) -> dict[str, int]:
        prompt = sum(len(c.prompt_ids) for c in self.choices if c.counts_prompt)
        return usage(prompt, sum(out.num_output_tokens for out in finals.values()))

    def whole(self, outputs: list[tuple[int, RequestOutput]]) -> dict[str, Any]:
        per_choice: dict[int, list[RequestOutput]] = {c.index: [] for c in self.choices}
        for index, out in outputs:
            per_choice[index].append(out)
        finals = {i: outs[-1] for i, outs in per_choice.items()}
        for final in finals.values():
            if final.finish_reason == "error":
                raise APIError(500, f"generation failed: {final.error}")
        rendered = [self.whole_choice(self.choices[i], outs) for i, outs in per_choice.items()]
        return self.body(self.kind, rendered, self.usage(finals))

    async def stream(self, events: AsyncIterator[tuple[int, RequestOutput]]) -> AsyncIterator[str]:
        """Per choice an opening chunk, then one chunk per engine step that produced tokens (the finish reason
        on its last); then usage when asked, then ``[DONE]``."""
        started: set[int] = set()
        finals: dict[int, RequestOutput] = {}
        async for index, out in events:
            if out.finish_reason == "error":
                yield sse({"error": {"message": out.error, "type": "server_error", "param": None, "code": 500}})
                break
            if index not in started:
                started.add(index)
                for chunk in self.opening(self.choices[index], out):
                    yield sse(self.body(self.chunk_kind, [chunk]))
            if out.new_token_ids or out.finished:
                for chunk in self.delta_chunks(index, out):
                    yield sse(self.body(self.chunk_kind, [chunk]))
            if out.finished:
                finals[index] = out
        else:
            if self.gen.include_usage:
                yield sse(self.body(self.chunk_kind, [], self.usage(finals)))
        yield DONE

    @staticmethod
    def generated(outs: list[RequestOutput]) -> list[tuple[int, TokenLogprob | None]]:
        pairs: list[tuple[int, TokenLogprob | None]] = []
        for out in outs:
            lps = out.new_logprobs or [None] * len(out.new_token_ids)
            pairs += list(zip(out.new_token_ids, lps, strict=True))
        return pairs

    # ---- what a choice looks like (completions) ----

    def opening(self, choice: Choice, first: RequestOutput) -> list[dict[str, Any]]:
        if not self.gen.echo:
            return []
        block = None
        if self.gen.logprobs is not None:
            block = self._stream_logprobs(choice.index).block(self.prompt_entries(choice, first.prompt_logprobs))
        return [self._ids({"index": choice.index, "text": choice.prompt_text, "logprobs": block,
                           "finish_reason": None}, choice, [])]

    def prompt_entries(
        self, choice: Choice, prompt_logprobs: list[TokenLogprob | None] | None
    ) -> list[tuple[int, TokenLogprob | None]]:
        lps = prompt_logprobs or [None] * len(choice.prompt_ids)
        return list(zip(choice.prompt_ids, lps, strict=True))

    def _stream_logprobs(self, index: int) -> LegacyLogprobs:
        if index not in self._logprobs:
            self._logprobs[index] = LegacyLogprobs(self.token_text, self.visible_len)
        return self._logprobs[index]

    def whole_choice(self, choice: Choice, outs: list[RequestOutput]) -> dict[str, Any]:
        text = (choice.prompt_text if self.gen.echo else "") + "".join(o.new_text for o in outs)
        block = None
        if self.gen.logprobs is not None:
            entries = self.generated(outs)
            if self.gen.echo:
                prompt_lps = next((o.prompt_logprobs for o in outs if o.prompt_logprobs is not None), None)
                entries = self.prompt_entries(choice, prompt_lps) + entries
            block = LegacyLogprobs(self.token_text, self.visible_len).block(entries)
        return self._ids({"index": choice.index, "text": text, "logprobs": block,
                          "finish_reason": outs[-1].finish_reason}, choice, _token_ids(outs))

    def delta_chunks(self, index: int, out: RequestOutput) -> list[dict[str, Any]]:
        """The chunks of one engine step's output for choice ``index`` (one, unless a subclass splits it)."""
        return [self.delta_choice(index, out)]

    def delta_choice(self, index: int, out: RequestOutput) -> dict[str, Any]:
        block = None
        if self.gen.logprobs is not None:
            block = self._stream_logprobs(index).block(self.generated([out]))
        chunk = {"index": index, "text": out.new_text, "logprobs": block, "finish_reason": out.finish_reason}
        return self._ids(chunk, self.choices[index], list(out.new_token_ids), prompt=index not in self._sent_ids)

    def _ids(self, choice_body: dict[str, Any], choice: Choice, ids: list[int], prompt: bool = True) -> dict:
        """With ``return_token_ids``: the choice's generated ``token_ids`` (a stream: this chunk's) and its
        ``prompt_token_ids`` (a stream: on the choice's first chunk that carries them)."""
        if self.gen.return_token_ids:
            if prompt:
                choice_body["prompt_token_ids"] = list(choice.prompt_ids)
                self._sent_ids.add(choice.index)
            choice_body["token_ids"] = ids
        return choice_body


def _token_ids(outs: list[RequestOutput]) -> list[int]:
    return [t for out in outs for t in out.new_token_ids]


class LegacyLogprobs:
    """The completions format: parallel lists ``tokens``, ``token_logprobs``, ``top_logprobs`` (token text ->
    logprob: the top alternatives and the chosen token) and ``text_offset`` (where each token starts in the
    choice's text, continuing across the chunks of one choice; a special token such as BOS adds no text)."""

    def __init__(self, token_text: Callable[[int], str], visible_len: Callable[[int], int]) -> None:
        self.token_text = token_text
        self.visible_len = visible_len
        self.offset = 0

    def block(self, entries: list[tuple[int, TokenLogprob | None]]) -> dict[str, list[Any]]:
        tokens: list[str] = []
        token_logprobs: list[float | None] = []
        top_logprobs: list[dict[str, float] | None] = []
        offsets: list[int] = []
        for token_id, lp in entries:
            text = self.token_text(token_id)
            tokens.append(text)
            offsets.append(self.offset)
            self.offset += self.visible_len(token_id)
            if lp is None:
                token_logprobs.append(None)
                top_logprobs.append(None)
                continue
            token_logprobs.append(_lp(lp.logprob))
            top: dict[str, float] = {}
            for alt, value in lp.top:
                top.setdefault(self.token_text(alt), _lp(value))
            top.setdefault(text, _lp(lp.logprob))
            top_logprobs.append(top)
        return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs,
                "text_offset": offsets}


class ChatRenderer(Renderer):
    prefix = "chatcmpl"
    kind = "chat.completion"
    chunk_kind = "chat.completion.chunk"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._streams: dict[int, StreamedChoice] = {}

    def opening(self, choice: Choice, first: RequestOutput) -> list[dict[str, Any]]:
        delta = {"role": "assistant", "content": ""}
        return [{"index": choice.index, "delta": delta, "logprobs": None, "finish_reason": None}]

    def chat_logprobs(self, entries: list[tuple[int, TokenLogprob | None]]) -> dict[str, Any] | None:
        if self.gen.logprobs is None:
            return None
        return {"content": [self._entry(token_id, lp) for token_id, lp in entries if lp is not None]}

    def _entry(self, token_id: int, lp: TokenLogprob) -> dict[str, Any]:
        def one(tid: int, value: float) -> dict[str, Any]:
            text = self.token_text(tid)
            return {"token": text, "logprob": _lp(value), "bytes": list(text.encode("utf-8"))}

        return {**one(token_id, lp.logprob), "top_logprobs": [one(tid, v) for tid, v in lp.top]}

    def whole_choice(self, choice: Choice, outs: list[RequestOutput]) -> dict[str, Any]:
        settings = self.gen.chat or ChatSettings()
        msg = read_text(settings, "".join(o.new_text for o in outs))
        body = {"index": choice.index, "message": message_fields(settings, msg),
                "logprobs": self.chat_logprobs(self.generated(outs)),
                "finish_reason": _finish(outs[-1].finish_reason, msg)}
        if msg.errors:
            body["day0_tool_call_errors"] = msg.errors
        return self._ids(body, choice, _token_ids(outs))

    def delta_chunks(self, index: int, out: RequestOutput) -> list[dict[str, Any]]:
        """A step's new text as a reasoning/content delta; the last step's also carries the tool calls (a chunk
        each for a call's name and its arguments) and the finish reason on its last chunk."""
        if index not in self._streams:
            self._streams[index] = StreamedChoice(self.gen.chat or ChatSettings())
        stream = self._streams[index]
        first = {"index": index, "delta": {}, "logprobs": self.chat_logprobs(self.generated([out])),
                 "finish_reason": None}
        first = self._ids(first, self.choices[index], list(out.new_token_ids), prompt=index not in self._sent_ids)
        if not out.finished:
            first["delta"] = stream.feed(out.new_text)
            return [first]
        deltas, msg = stream.finish(out.new_text)
        first["delta"] = deltas[0]
        chunks = [first] + [{"index": index, "delta": d, "logprobs": None, "finish_reason": None} for d in deltas[1:]]
        chunks[-1]["finish_reason"] = _finish(out.finish_reason, msg)
        if msg.errors:
            chunks[-1]["day0_tool_call_errors"] = msg.errors
        return chunks


def _finish(reason: str | None, msg: Message) -> str | None:
    return "tool_calls" if msg.calls and reason == "stop" else reason
