"""OpenAI request bodies turned into engine arguments: the fields each endpoint knows (any other is a 400
naming it), the parameters the runtime does not implement (a 400 unless given their neutral value), typed
sampling fields and the completion prompt forms."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from agents.runtime.engine import SamplingParams
from agents.runtime.engine.sampling_params import MAX_LOGPROBS, SEED_RANGE
from agents.runtime.server.errors import APIError
from agents.runtime.server.fields import get_bool, get_int, get_number, get_object, get_str, is_int
from agents.runtime.server.structured import PROCESSING_FIELDS, processing_params, response_format_grammar

MAX_N = 64  # choices per prompt
MAX_CHOICES = 256  # prompts x n per request
MAX_STOP = 16
MAX_STOP_LEN = 512

SAMPLING_FIELDS = frozenset({
    "model", "max_tokens", "temperature", "top_p", "top_k", "n", "stream", "stream_options", "stop",
    "stop_token_ids", "seed", "ignore_eos", "user", "return_token_ids", "return_tokens_as_token_ids",
}) | PROCESSING_FIELDS
# parameters accepted only at the value that means "off": anything else would be silently ignored
NEUTRAL: dict[str, tuple[Any, ...]] = {}
COMPLETION_NEUTRAL: dict[str, tuple[Any, ...]] = {**NEUTRAL, "suffix": ("",)}
CHAT_NEUTRAL: dict[str, tuple[Any, ...]] = {
    **NEUTRAL,
    "functions": ([],),
    "function_call": ("none",),
}
COMPLETION_FIELDS = (SAMPLING_FIELDS | {"prompt", "echo", "logprobs", "best_of", "response_format"}
                     | set(COMPLETION_NEUTRAL))
CHAT_FIELDS = (SAMPLING_FIELDS | {"messages", "max_completion_tokens", "logprobs", "top_logprobs",
                                  "parallel_tool_calls", "tools", "tool_choice", "response_format",
                                  "chat_template_kwargs"} | set(CHAT_NEUTRAL))


@dataclass
class Generation:
    """What one request asks for beyond its sampling parameters."""

    params: SamplingParams
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    echo: bool = False
    logprobs: int | None = None  # completions: top alternatives (0..20); chat: top_logprobs when logprobs is on
    return_token_ids: bool = False  # vLLM's extension: each choice carries its prompt's and its own token ids
    tokens_as_ids: bool = False  # vLLM's ``return_tokens_as_token_ids``: logprobs name tokens "token_id:N"
    chat: Any = None  # chat: how its text is read (server/chat_output.ChatSettings: tool calls, reasoning)

    def choice_params(self, j: int) -> SamplingParams:
        """Choice ``j`` of ``n``: its own seed (the request's seed plus j), so seeded choices differ."""
        seed = self.params.seed
        if j == 0 or seed is None:
            return self.params
        return replace(self.params, seed=(seed + j) % SEED_RANGE[1])


def check_fields(body: dict, known: frozenset[str] | set[str], neutral: dict[str, tuple[Any, ...]]) -> None:
    unknown = sorted(set(body) - set(known))
    if unknown:
        raise APIError(400, f"unknown or unsupported parameter(s): {', '.join(unknown)}", unknown[0])
    for key, accepted in neutral.items():
        value = body.get(key)
        if value is not None and not any(_same(value, ok) for ok in accepted):
            raise APIError(400, f"'{key}' is not supported by this runtime (only {accepted[0]!r} or null)", key)


def _same(value: Any, neutral: Any) -> bool:
    """``value`` is the neutral one: any number equal to a numeric one (0 or 0.0), else the same type and value."""
    if is_number(neutral):
        return is_number(value) and value == neutral
    return type(value) is type(neutral) and value == neutral


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def check_model(body: dict, served: str) -> None:
    model = body.get("model")
    if model is None:
        return
    if not isinstance(model, str):
        raise APIError(400, "'model' must be a string", "model")
    if model != served:
        raise APIError(404, f"The model '{model[:200]}' does not exist; this server serves '{served}'", "model",
                       code="model_not_found")


def _stop(body: dict) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if (not isinstance(stop, list) or len(stop) > MAX_STOP
            or not all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_LEN for s in stop)):
        raise APIError(400, f"'stop' must be a non-empty string or a list of at most {MAX_STOP} of them "
                            f"(each at most {MAX_STOP_LEN} characters)", "stop")
    return stop


def _stop_token_ids(body: dict) -> list[int]:
    ids = body.get("stop_token_ids")
    if ids is None:
        return []
    if not isinstance(ids, list) or not all(is_int(t) for t in ids):
        raise APIError(400, "'stop_token_ids' must be a list of integers", "stop_token_ids")
    return ids


def generation(
    body: dict,
    *,
    max_model_len: int,
    default_max_tokens: int | None,
    min_max_tokens: int = 1,
    logprobs: int | None = None,
    prompt_logprobs: int | None = None,
) -> Generation:
    """Validate the shared fields; ``default_max_tokens`` None means "the rest of the context"."""
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = get_int(body, key, default_max_tokens, lo=min_max_tokens, hi=max_model_len - 1)
    n = get_int(body, "n", 1, lo=1, hi=MAX_N)
    get_str(body, "user", 512)
    stream = get_bool(body, "stream")
    options = get_object(body, "stream_options", frozenset({"include_usage"}))
    if options and not stream:
        raise APIError(400, "'stream_options' is only allowed with 'stream': true", "stream_options")
    include_usage = get_bool(options, "include_usage")
    if max_tokens == 0 and prompt_logprobs is None:
        prompt_logprobs = 0  # a prefill-only request: the engine scores the prompt and draws nothing
    try:
        params = SamplingParams(
            max_tokens=max_tokens if max_tokens is not None else 1,
            temperature=get_number(body, "temperature", 1.0),
            top_p=get_number(body, "top_p", 1.0),
            top_k=get_int(body, "top_k", 0),
            seed=get_int(body, "seed", None),
            stop=_stop(body),
            stop_token_ids=_stop_token_ids(body),
            ignore_eos=get_bool(body, "ignore_eos"),
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            grammar=response_format_grammar(body),
            **processing_params(body),
        )
    except ValueError as exc:
        param = str(exc).split(" ", 1)[0]
        raise APIError(400, str(exc), param if param in body else None) from exc
    return Generation(params, n=n, stream=stream, include_usage=include_usage,
                      return_token_ids=get_bool(body, "return_token_ids"),
                      tokens_as_ids=get_bool(body, "return_tokens_as_token_ids"))


def completion_generation(body: dict, *, max_model_len: int) -> Generation:
    """``/v1/completions``: legacy ``logprobs`` (0..20 alternatives), ``echo`` (with logprobs: the prompt's),
    ``best_of`` only equal to ``n``."""
    check_fields(body, COMPLETION_FIELDS, COMPLETION_NEUTRAL)
    logprobs = get_int(body, "logprobs", None, lo=0, hi=MAX_LOGPROBS)
    echo = get_bool(body, "echo")
    gen = generation(body, max_model_len=max_model_len, default_max_tokens=16, min_max_tokens=0,
                     logprobs=logprobs, prompt_logprobs=logprobs if echo else None)
    best_of = get_int(body, "best_of", None, lo=1, hi=MAX_N)
    if best_of is not None and best_of != gen.n:
        raise APIError(400, f"'best_of' ({best_of}) other than 'n' ({gen.n}) is not supported", "best_of")
    gen.echo, gen.logprobs = echo, logprobs
    return gen


def chat_generation(body: dict, *, max_model_len: int, prompt_tokens: int) -> Generation:
    """``/v1/chat/completions``: ``logprobs`` true with ``top_logprobs`` (0..20) alternatives."""
    check_fields(body, CHAT_FIELDS, CHAT_NEUTRAL)
    get_bool(body, "parallel_tool_calls")
    want = get_bool(body, "logprobs")
    top = get_int(body, "top_logprobs", None, lo=0, hi=MAX_LOGPROBS)
    if top is not None and not want:
        raise APIError(400, "'top_logprobs' needs 'logprobs': true", "top_logprobs")
    logprobs = (top or 0) if want else None
    room = max(1, max_model_len - prompt_tokens)
    gen = generation(body, max_model_len=max_model_len, default_max_tokens=room, logprobs=logprobs)
    gen.logprobs = logprobs
    return gen


def completion_prompts(body: dict) -> list[str | list[int]]:
    """One prompt or a batch: a string, a list of strings, a list of token ids, or a list of such lists."""
    prompt = body.get("prompt")
    prompts: list[Any] | None = None
    if isinstance(prompt, str):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            prompts = prompt
        elif all(is_int(t) for t in prompt):
            prompts = [prompt]
        elif all(isinstance(p, list) and all(is_int(t) for t in p) for p in prompt):
            prompts = prompt
    if prompts is None:
        raise APIError(400, "'prompt' must be a string, a list of strings, a list of token ids or a list of "
                            "lists of token ids", "prompt")
    if len(prompts) > MAX_CHOICES:
        raise APIError(400, f"'prompt' holds {len(prompts)} prompts; at most {MAX_CHOICES} per request", "prompt")
    for i, p in enumerate(prompts):
        if not p or (isinstance(p, str) and not p.strip()):
            raise APIError(400, f"prompt {i} is empty", "prompt")
    return prompts


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
