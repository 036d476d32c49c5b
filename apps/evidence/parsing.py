"""Small typed readers for result documents; each error names the path of the bad value."""

from __future__ import annotations

import math
from typing import Any

from django.core.exceptions import ValidationError


def fail(path: str, message: str) -> ValidationError:
    return ValidationError({path: message})


def obj(value: Any, path: str, *, required: bool = True) -> dict[str, Any]:
    if value is None and not required:
        return {}
    if not isinstance(value, dict):
        raise fail(path, "must be an object")
    return value


def arr(value: Any, path: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise fail(path, "must be a list")
    return value


def num(section: dict[str, Any], key: str, path: str, *, required: bool = False) -> float | None:
    value = section.get(key)
    if value is None:
        if required:
            raise fail(f"{path}.{key}", "is required")
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise fail(f"{path}.{key}", f"must be a number, got {type(value).__name__}")
    if not math.isfinite(value):
        return None  # NaN/Inf metrics are stored as unknown (JSON has no NaN; some clients send it anyway)
    return float(value)


def integer(section: dict[str, Any], key: str, path: str, *, required: bool = False) -> int | None:
    value = section.get(key)
    if value is None:
        if required:
            raise fail(f"{path}.{key}", "is required")
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise fail(f"{path}.{key}", f"must be an integer, got {type(value).__name__}")
    if abs(value) >= 2**63:
        raise fail(f"{path}.{key}", "is out of range")
    return value


def boolean(section: dict[str, Any], key: str, path: str, *, required: bool = False) -> bool | None:
    value = section.get(key)
    if value is None:
        if required:
            raise fail(f"{path}.{key}", "is required")
        return None
    if not isinstance(value, bool):
        raise fail(f"{path}.{key}", f"must be true or false, got {type(value).__name__}")
    return value


def text(section: dict[str, Any], key: str, path: str, *, max_length: int = 255, required: bool = False) -> str:
    value = section.get(key)
    if value is None:
        if required:
            raise fail(f"{path}.{key}", "is required")
        return ""
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise fail(f"{path}.{key}", f"must be a string, got {type(value).__name__}")
    if len(value) > max_length:
        raise fail(f"{path}.{key}", f"is longer than {max_length} characters")
    return value
