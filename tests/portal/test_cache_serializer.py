"""Django's cache in Redis holds JSON, never pickle: a value planted in Redis is data, not code."""

from __future__ import annotations

import os
import pickle
import secrets
from pathlib import Path

import pytest
import redis

from day0portal.cache import JSONSerializer
from tests.factories import HardwareFactory, ModelReleaseFactory

pytestmark = pytest.mark.django_db


class _Planted:
    """Unpickling this creates ``path``: proof that a read ran code."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple:
        return (open, (str(self.path), "w"))


def test_values_round_trip_as_written() -> None:
    s = JSONSerializer()
    for value in ({("m", "h"): ["ttft_ms_p50"]}, (True, 2, "bfloat16"), ("a", "b"), (), {"__tuple__": [1]},
                  {"k": [1, 2.5, None, {"n": (1,)}]}, "text", 3.25, None, False, [()]):
        assert s.loads(s.dumps(value)) == value and type(s.loads(s.dumps(value))) is type(value)
    assert s.dumps(7) == 7 and s.loads(b"7") == 7  # raw integers: incr/decr stay atomic
    with pytest.raises(TypeError, match="JSON data only"):
        s.dumps({"at": object()})


def _json_or_counter(value: bytes) -> bool:
    """What the serializer writes: JSON data, or an integer kept raw (a counter, the matrix's version)."""
    return value.startswith((b"{", b"[")) or value.isdigit()


def test_a_pickle_planted_in_redis_is_a_miss_and_the_page_still_answers(client, settings, tmp_path) -> None:
    url = os.environ.get("DAY0_REDIS_URL")
    if not url:
        pytest.fail("this test needs Redis: set DAY0_REDIS_URL (see `make test`)")
    prefix = f"day0pickle{os.getpid()}{secrets.token_hex(3)}"
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": url,
                                   "KEY_PREFIX": prefix, "OPTIONS": {"serializer": "day0portal.cache.JSONSerializer"}}}
    ModelReleaseFactory()
    HardwareFactory()
    server = redis.Redis.from_url(url)
    try:
        assert client.get("/?dtype=bfloat16").status_code == 200  # caches the cells' fits in bfloat16
        keys = list(server.scan_iter(f"{prefix}:*"))
        assert keys, "the matrix cached nothing: this test would prove nothing"
        assert all(_json_or_counter(server.get(k)) for k in keys)  # JSON, not a pickle

        canary, control = tmp_path / "ran", tmp_path / "control"
        pickle.loads(pickle.dumps(_Planted(control)))  # the payload is live: unpickled, it runs
        assert control.exists()
        for key in keys:
            server.set(key, pickle.dumps(_Planted(canary)))
        response = client.get("/?dtype=bfloat16")
        assert response.status_code == 200 and not canary.exists()
        assert all(_json_or_counter(server.get(k)) for k in keys)  # the misses were recomputed
    finally:
        for key in server.scan_iter(f"{prefix}:*"):
            server.delete(key)
