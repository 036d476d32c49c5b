"""Strictly typed reading of a JSON request body: bounded nesting, no lone surrogates, no NaN, every field of
the type it must have (``"stream": "yes"`` is an error, not a true)."""

from __future__ import annotations

import json
from typing import Any

from agents.runtime.server.errors import APIError

MAX_DEPTH = 32  # OpenAI bodies nest a few levels (messages -> content parts -> fields)


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def parse_json(raw: bytes) -> dict[str, Any]:
    """The body as a dict, or APIError(400) naming what is wrong with it."""
    try:
        body = json.loads(raw, parse_constant=_no_constant)
    except RecursionError as exc:
        raise APIError(400, f"request body nests deeper than {MAX_DEPTH} levels") from exc
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as exc:
        raise APIError(400, f"request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise APIError(400, "request body must be a JSON object")
    check_tree(body)
    return body


def check_tree(body: Any) -> None:
    """Refuse nesting deeper than MAX_DEPTH and strings that are not valid Unicode (a lone surrogate such as
    ``\\ud800`` parses in JSON but cannot be tokenized or encoded back); the error names the field."""
    stack: list[tuple[Any, str, int]] = [(body, "", 0)]
    while stack:
        value, path, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise APIError(400, f"request body nests deeper than {MAX_DEPTH} levels (at {path or 'the top'})")
        if isinstance(value, str):
            _check_text(value, path)
        elif isinstance(value, dict):
            for key, item in value.items():
                _check_text(key, path)
                stack.append((item, f"{path}.{key}" if path else key, depth + 1))
        elif isinstance(value, list):
            stack.extend((item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value))


def _check_text(text: str, path: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        field = path.split(".")[0].split("[")[0] or None
        raise APIError(400, f"'{path}' is not valid Unicode: a lone surrogate at character {exc.start}", field) \
            from None


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def get_int(body: dict, key: str, default: int | None, lo: int | None = None, hi: int | None = None) -> int | None:
    """An integer field (``None``/absent: ``default``) within [lo, hi]."""
    value = body.get(key)
    if value is None:
        return default
    if not is_int(value):
        raise APIError(400, f"'{key}' must be an integer, got {_show(value)}", key)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise APIError(400, f"'{key}' must be in [{lo}, {hi}], got {_show(value)}", key)
    return value


def get_number(body: dict, key: str, default: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise APIError(400, f"'{key}' must be a number, got {_show(value)}", key)
    try:
        return float(value)
    except OverflowError:
        raise APIError(400, f"'{key}' is out of range, got {_show(value)}", key) from None


def get_bool(body: dict, key: str, default: bool = False) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise APIError(400, f"'{key}' must be true or false, got {_show(value)}", key)
    return value


def get_str(body: dict, key: str, max_len: int) -> str | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > max_len:
        raise APIError(400, f"'{key}' must be a string of at most {max_len} characters", key)
    return value


def get_object(body: dict, key: str, allowed: frozenset[str]) -> dict[str, Any]:
    value = body.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise APIError(400, f"'{key}' must be an object, got {_show(value)}", key)
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise APIError(400, f"'{key}' has unknown field(s) {', '.join(unknown)} (known: {', '.join(sorted(allowed))})",
                       key)
    return value


def _show(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=True)
    return text if len(text) <= 60 else text[:57] + "..."
