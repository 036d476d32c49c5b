"""What the engine hands back after each step, per request."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class TokenLogprob:
    """One token's log-probability under the model's fp32 logits (log-softmax, before temperature or
    filtering) and the ``top`` most likely tokens at that position as (token id, logprob), best first."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass
class RequestOutput:
    """New tokens and text of one request since the last step; the totals when ``finished``.
    ``finish_reason``: "stop" (EOS, stop token or stop string), "length", "abort" or "error"."""

    request_id: str
    new_token_ids: list[int] = field(default_factory=list)
    new_text: str = ""
    finished: bool = False
    finish_reason: str | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    output_token_ids: list[int] | None = None  # set when finished
    text: str | None = None  # set when finished
    error: str | None = None
    arrival_time: float = 0.0
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finish_time: float | None = None
    new_logprobs: list[TokenLogprob] | None = None  # one per new token, when the request asked for logprobs
    # the prompt's logprobs (the first token has none): with the first output after the prefill and the final one
    prompt_logprobs: list[TokenLogprob | None] | None = None


class RequestError(ValueError):
    """A request the engine refuses (bad prompt or parameters); the message names what was wrong."""


class QueueFullError(RuntimeError):
    """The engine holds ``max_pending`` requests already."""
