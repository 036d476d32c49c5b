"""The request fields that change the logits before sampling (penalties, ``min_p``, ``logit_bias``,
``min_tokens``) and ``response_format``, read from an OpenAI body into ``SamplingParams`` keyword arguments;
every error is a 400 naming its field."""

from __future__ import annotations

from typing import Any

from agents.runtime.engine.grammar import GrammarError, grammar_for_response_format
from agents.runtime.engine.sampling_params import MAX_LOGIT_BIAS
from agents.runtime.server.errors import APIError
from agents.runtime.server.fields import get_int, get_number

PROCESSING_FIELDS = frozenset({"presence_penalty", "frequency_penalty", "repetition_penalty", "min_p",
                               "logit_bias", "min_tokens"})
RESPONSE_FORMAT_TYPES = ("text", "json_object", "json_schema")
MAX_SCHEMA_CHARS = 100_000


def processing_params(body: dict) -> dict[str, Any]:
    """The logits-processing fields of ``body`` as ``SamplingParams`` keyword arguments (range errors are left
    to ``SamplingParams``, whose messages start with the field's name)."""
    return {
        "presence_penalty": get_number(body, "presence_penalty", 0.0),
        "frequency_penalty": get_number(body, "frequency_penalty", 0.0),
        "repetition_penalty": get_number(body, "repetition_penalty", 1.0),
        "min_p": get_number(body, "min_p", 0.0),
        "min_tokens": get_int(body, "min_tokens", 0, lo=0),
        "logit_bias": logit_bias(body),
    }


def logit_bias(body: dict) -> dict[int, float]:
    """OpenAI's form: token ids as strings mapped to a bias in [-100, 100]."""
    raw = body.get("logit_bias")
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise APIError(400, "'logit_bias' must be an object mapping token ids to numbers", "logit_bias")
    if len(raw) > MAX_LOGIT_BIAS:
        raise APIError(400, f"'logit_bias' holds {len(raw)} entries; at most {MAX_LOGIT_BIAS}", "logit_bias")
    out: dict[int, float] = {}
    for key, value in raw.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 10):
            raise APIError(400, f"'logit_bias' key {key[:40]!r} is not a token id", "logit_bias")
        if isinstance(value, bool) or not isinstance(value, int | float) or not -100 <= value <= 100:
            raise APIError(400, f"'logit_bias' value for token {key} must be a number in [-100, 100]", "logit_bias")
        out[int(key)] = float(value)
    return out


def check_logit_bias(bias: dict[int, float], vocab_size: int) -> None:
    beyond = [t for t in bias if t >= vocab_size]
    if beyond:
        raise APIError(400, f"'logit_bias' token id {beyond[0]} is beyond the vocabulary (size {vocab_size})",
                       "logit_bias")


def response_format_grammar(body: dict) -> str | None:
    """The llguidance grammar ``response_format`` asks for (None for text or absent)."""
    rf = body.get("response_format")
    if rf is None:
        return None
    if not isinstance(rf, dict) or rf.get("type") not in RESPONSE_FORMAT_TYPES:
        raise APIError(400, f"'response_format' must be an object whose 'type' is one of "
                            f"{', '.join(RESPONSE_FORMAT_TYPES)}", "response_format")
    allowed = {"text": {"type"}, "json_object": {"type"}, "json_schema": {"type", "json_schema"}}[rf["type"]]
    unknown = sorted(set(rf) - allowed)
    if unknown:
        raise APIError(400, f"'response_format' has unknown field(s) {', '.join(unknown)}", "response_format")
    if rf["type"] == "json_schema":
        spec = rf.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise APIError(400, "'response_format.json_schema' must be an object with a 'name'", "response_format")
        extra = sorted(set(spec) - {"name", "schema", "strict", "description"})
        if extra:
            raise APIError(400, f"'response_format.json_schema' has unknown field(s) {', '.join(extra)}",
                           "response_format")
        if spec.get("strict") is not None and not isinstance(spec["strict"], bool):
            raise APIError(400, "'response_format.json_schema.strict' must be true or false", "response_format")
        if not isinstance(spec.get("schema", {}), dict) or len(repr(spec.get("schema"))) > MAX_SCHEMA_CHARS:
            raise APIError(400, f"'response_format.json_schema.schema' must be an object (at most "
                                f"{MAX_SCHEMA_CHARS} characters)", "response_format")
    try:
        return grammar_for_response_format(rf)
    except GrammarError as exc:
        name = (rf.get("json_schema") or {}).get("name")
        where = f" '{name}'" if name else ""
        raise APIError(400, f"'response_format' schema{where}: {exc}", "response_format") from None
