"""JSON for Django's Redis cache instead of pickle: a value read back from Redis is data, never code.

Django's ``RedisSerializer`` pickles every value and unpickles whatever the key holds on a read, so anyone able
to write to that Redis could run code in the portal. This serializer writes JSON; tuples and dicts with
non-string keys (the matrix's cached fits, the open regressions per cell) are tagged so they read back as they
were written. Bytes that are not such JSON (a value planted by another writer, an old pickled entry) read as a
miss: the caller recomputes, and the page still answers."""

from __future__ import annotations

import json
import logging
from typing import Any

logger = logging.getLogger(__name__)

TUPLE = "__tuple__"
ITEMS = "__items__"  # a dict whose keys are not all strings, as [key, value] pairs
_TAGS = (TUPLE, ITEMS)


def _encode(obj: Any) -> Any:
    if isinstance(obj, tuple):
        return {TUPLE: [_encode(v) for v in obj]}
    if isinstance(obj, list):
        return [_encode(v) for v in obj]
    if isinstance(obj, dict):
        if all(isinstance(k, str) for k in obj) and not (len(obj) == 1 and next(iter(obj)) in _TAGS):
            return {k: _encode(v) for k, v in obj.items()}
        return {ITEMS: [[_encode(k), _encode(v)] for k, v in obj.items()]}
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    raise TypeError(f"the cache stores JSON data only, not {type(obj).__name__}")


def _decode(obj: Any) -> Any:
    if isinstance(obj, list):
        return [_decode(v) for v in obj]
    if isinstance(obj, dict):
        if len(obj) == 1 and TUPLE in obj and isinstance(obj[TUPLE], list):
            return tuple(_decode(v) for v in obj[TUPLE])
        if len(obj) == 1 and ITEMS in obj and isinstance(obj[ITEMS], list):
            return {_hashable(_decode(k)): _decode(v) for k, v in obj[ITEMS]}
        return {k: _decode(v) for k, v in obj.items()}
    return obj


def _hashable(key: Any) -> Any:
    if isinstance(key, (list, dict)):
        raise ValueError("a cached dict key is a list or a dict")
    return key


class JSONSerializer:
    """``CACHES["default"]["OPTIONS"]["serializer"]`` of ``django.core.cache.backends.redis.RedisCache``.
    Integers stay raw (as Django's own serializer keeps them) so ``incr``/``decr`` remain atomic."""

    def dumps(self, obj: Any) -> bytes | int:
        if type(obj) is int:
            return obj
        return json.dumps(_encode(obj), separators=(",", ":")).encode()

    def loads(self, data: bytes) -> Any:
        try:
            return int(data)
        except ValueError:
            pass
        try:
            return _decode(json.loads(data))
        except (ValueError, TypeError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
            logger.warning("cache: a value that is not the portal's JSON was read as a miss (%s)", exc)
            return None
