"""Small typed readers for result documents; each error names the path of the bad value, in the words of
``contract.sections.type_message`` (the pipeline refuses a malformed section with the same sentence)."""

from __future__ import annotations

import math
from typing import Any

from django.core.exceptions import ValidationError

from contract.sections import BOOL, INT, LIST, NUM, OBJ, TEXT, type_message

# The largest magnitude a result number may have: above every real count of bytes, tokens or milliseconds,
# and below PostgreSQL's bigint (2**63 ≈ 9.2e18).
MAX_NUMBER = 1e18


def fail(path: str, message: str) -> ValidationError:
    return ValidationError({path: message})


def obj(value: Any, path: str, *, required: bool = True) -> dict[str, Any]:
    if value is None and not required:
        return {}
    if (message := type_message(OBJ, value)) is not None:
        raise fail(path, message)
    return value


def arr(value: Any, path: str, *, max_items: int = 10_000) -> list[Any]:
    if value is None:
        return []
    if (message := type_message(LIST, value)) is not None:
        raise fail(path, message)
    if len(value) > max_items:
        raise fail(path, f"has {len(value)} items; at most {max_items} are accepted")
    return value


def num(section: dict[str, Any], key: str, path: str, *, required: bool = False) -> float | None:
    value = section.get(key)
    if value is None:
        if required:
            raise fail(f"{path}.{key}", "is required")
        return None
    if (message := type_message(NUM, value)) is not None:
        raise fail(f"{path}.{key}", message)
    if not math.isfinite(value):
        return None  # NaN/Inf metrics are stored as unknown (JSON has no NaN; some clients send it anyway)
    if abs(value) > MAX_NUMBER:
        raise fail(f"{path}.{key}", f"{value:g} is out of range: a result number is at most {MAX_NUMBER:g} in size")
    return float(value)


def integer(section: dict[str, Any], key: str, path: str, *, required: bool = False, low: int | None = None,
            high: int | None = None) -> int | None:
    value = section.get(key)
    if value is None:
        if required:
            raise fail(f"{path}.{key}", "is required")
        return None
    if (message := type_message(INT, value)) is not None:
        raise fail(f"{path}.{key}", message)
    if isinstance(value, float):
        if abs(value) > MAX_NUMBER:
            raise fail(f"{path}.{key}", f"{value:g} is out of range: at most {MAX_NUMBER:g} in size")
        value = int(value)
    if abs(value) > MAX_NUMBER:
        raise fail(f"{path}.{key}", f"{value} is out of range: at most {MAX_NUMBER:g} in size")
    if low is not None and value < low or high is not None and value > high:
        raise fail(f"{path}.{key}", f"{value} is out of range: must be from {low} to {high}")
    return value


def check_numbers(value: Any, path: str, *, max_depth: int = 32) -> None:
    """Every number anywhere in ``value`` is finite and at most ``MAX_NUMBER`` in size, and the document nests
    at most ``max_depth`` deep; the first offender is a ValidationError naming its path."""
    stack: list[tuple[Any, str, int]] = [(value, path, 0)]
    while stack:
        item, at, depth = stack.pop()
        if depth > max_depth:
            raise fail(at, f"nests deeper than {max_depth} levels")
        if isinstance(item, dict):
            stack.extend((v, f"{at}.{k}", depth + 1) for k, v in item.items())
        elif isinstance(item, list):
            stack.extend((v, f"{at}[{i}]", depth + 1) for i, v in enumerate(item))
        elif isinstance(item, float) and not isinstance(item, bool):
            if not math.isfinite(item):
                raise fail(at, "must be a finite number")
            if abs(item) > MAX_NUMBER:
                raise fail(at, f"{item:g} is out of range: a result number is at most {MAX_NUMBER:g} in size")
        elif isinstance(item, int) and not isinstance(item, bool) and abs(item) > MAX_NUMBER:
            raise fail(at, f"{item} is out of range: a result number is at most {MAX_NUMBER:g} in size")


def boolean(section: dict[str, Any], key: str, path: str, *, required: bool = False) -> bool | None:
    value = section.get(key)
    if value is None:
        if required:
            raise fail(f"{path}.{key}", "is required")
        return None
    if (message := type_message(BOOL, value)) is not None:
        raise fail(f"{path}.{key}", message)
    return value


def text(section: dict[str, Any], key: str, path: str, *, max_length: int = 255, required: bool = False) -> str:
    value = section.get(key)
    if value is None:
        if required:
            raise fail(f"{path}.{key}", "is required")
        return ""
    if (message := type_message(TEXT, value)) is not None:
        raise fail(f"{path}.{key}", message)
    if not isinstance(value, str):
        value = str(value)  # a number where text is asked: its text
    if len(value) > max_length:
        raise fail(f"{path}.{key}", f"is longer than {max_length} characters")
    return value
