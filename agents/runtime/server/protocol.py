"""OpenAI request bodies turned into engine arguments, and the OpenAI error shape."""

from __future__ import annotations

from starlette.responses import JSONResponse

from agents.runtime.engine import SamplingParams


class APIError(Exception):
    """An error answered in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, status: int, message: str, param: str | None = None, err_type: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.err_type = err_type or ("invalid_request_error" if status < 500 else "server_error")

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.err_type, "param": self.param, "code": self.status}}
        headers = {"Retry-After": "1"} if self.status in (429, 503) else None
        return JSONResponse(body, status_code=self.status, headers=headers)


def _int(body: dict, key: str, default: int | None) -> int | None:
    value = body.get(key, default)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise APIError(400, f"'{key}' must be an integer, got {value!r}", key)
    return value


def _number(body: dict, key: str, default: float) -> float:
    value = body.get(key, default)
    if value is None:
        return default
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise APIError(400, f"'{key}' must be a number, got {value!r}", key)
    return float(value)


def check_model(body: dict, served: str) -> None:
    model = body.get("model")
    if model is not None and model != served:
        raise APIError(400, f"The model '{model}' does not exist; this server serves '{served}'", "model")


def sampling_params(body: dict, *, max_model_len: int, default_max_tokens: int | None) -> SamplingParams:
    """Validate the shared sampling fields; ``default_max_tokens`` None means "the rest of the context"."""
    for unsupported, ok in (("n", 1), ("best_of", 1), ("echo", False), ("logprobs", None)):
        value = body.get(unsupported, ok)
        if value not in (ok, None, False) or (unsupported in ("n", "best_of") and value not in (1, None)):
            raise APIError(400, f"'{unsupported}'={value!r} is not supported (only {ok!r})", unsupported)
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _int(body, key, default_max_tokens)
    if max_tokens is not None and max_tokens < 1:
        raise APIError(400, f"'{key}' must be at least 1, got {max_tokens}", key)
    if max_tokens is not None and max_tokens >= max_model_len:
        raise APIError(400, f"'{key}' ({max_tokens}) must be below the model's context of {max_model_len}", key)
    stop = body.get("stop") or []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > 16:
        raise APIError(400, "'stop' must be a non-empty string or a list of at most 16 of them", "stop")
    stop_ids = body.get("stop_token_ids") or []
    try:
        return SamplingParams(
            max_tokens=max_tokens or 1,
            temperature=_number(body, "temperature", 1.0),
            top_p=_number(body, "top_p", 1.0),
            top_k=_int(body, "top_k", 0) or 0,
            seed=_int(body, "seed", None),
            stop=stop,
            stop_token_ids=stop_ids,
            ignore_eos=bool(body.get("ignore_eos", False)),
        )
    except ValueError as exc:
        raise APIError(400, str(exc)) from exc


def completion_prompt(body: dict) -> str | list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str) and prompt:
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return prompt
    raise APIError(400, "'prompt' must be a non-empty string or a list of token ids (one prompt per request)", "prompt")


def include_usage(body: dict) -> bool:
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise APIError(400, "'stream_options' must be an object", "stream_options")
    return bool(options.get("include_usage", False))


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
