"""Settings helpers: typed DAY0_* readers, *_FILE secrets, clear errors on bad values."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from day0portal.env import env_bool, env_int, env_list, env_str


def test_booleans(monkeypatch) -> None:
    for raw, value in (("1", True), ("yes", True), ("ON", True), ("0", False), ("false", False), ("", False)):
        monkeypatch.setenv("DAY0_X", raw)
        assert env_bool("DAY0_X") is value
    monkeypatch.setenv("DAY0_X", "maybe")
    with pytest.raises(ImproperlyConfigured, match="DAY0_X='maybe' is not a boolean"):
        env_bool("DAY0_X")
    monkeypatch.delenv("DAY0_X")
    assert env_bool("DAY0_X", True) is True


def test_integers_and_lists(monkeypatch) -> None:
    monkeypatch.setenv("DAY0_N", "12")
    assert env_int("DAY0_N", 3) == 12
    monkeypatch.setenv("DAY0_N", "twelve")
    with pytest.raises(ImproperlyConfigured, match="DAY0_N='twelve' is not an integer"):
        env_int("DAY0_N", 3)
    monkeypatch.setenv("DAY0_N", "-1")
    with pytest.raises(ImproperlyConfigured, match="below the minimum 0"):
        env_int("DAY0_N", 3, minimum=0)
    monkeypatch.setenv("DAY0_L", "a.example, b.example,,")
    assert env_list("DAY0_L") == ["a.example", "b.example"]


def test_file_secrets(monkeypatch, tmp_path) -> None:
    secret = tmp_path / "key"
    secret.write_text("s3cret\n")
    monkeypatch.setenv("DAY0_SECRET_KEY_FILE", str(secret))
    assert env_str("DAY0_SECRET_KEY") == "s3cret"
    monkeypatch.setenv("DAY0_SECRET_KEY_FILE", str(tmp_path / "missing"))
    with pytest.raises(ImproperlyConfigured, match="DAY0_SECRET_KEY_FILE"):
        env_str("DAY0_SECRET_KEY")


def test_embedded_default_settings_load_without_servers(tmp_path) -> None:
    """The same settings module with no DATABASE_URL/REDIS_URL: SQLite, filesystem broker, in-memory layer."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("DAY0_DATABASE_URL", "DAY0_REDIS_URL", "DAY0_BROKER_URL")}
    env["DAY0_DATA_DIR"] = str(tmp_path)
    code = ("from django.conf import settings as s; import django; django.setup(); "
            "print(s.DATABASES['default']['ENGINE'], s.CELERY_BROKER_URL, s.CHANNEL_LAYERS['default']['BACKEND'])")
    out = subprocess.run([sys.executable, "-c", code], env=dict(env, DJANGO_SETTINGS_MODULE="day0portal.settings"),
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["django.db.backends.sqlite3", "filesystem://", "channels.layers.InMemoryChannelLayer"]
    assert (tmp_path / "broker" / "queue").is_dir()
    bad = subprocess.run([sys.executable, "-c", code], env=dict(env, DJANGO_SETTINGS_MODULE="day0portal.settings",
                                                                DAY0_DEBUG="perhaps"), capture_output=True, text=True)
    assert bad.returncode != 0 and "DAY0_DEBUG='perhaps' is not a boolean" in bad.stderr


def test_production_settings_keep_the_broker_apart_from_the_cache_and_channel_redis(tmp_path) -> None:
    """DAY0_BROKER_URL (RabbitMQ) is the Celery broker; DAY0_REDIS_URL only the cache (JSON) and channel layer.
    Without DAY0_BROKER_URL the Redis is the broker too (the test suite's setup)."""
    import json
    import os
    import subprocess
    import sys

    code = ("from django.conf import settings as s; import django, json; django.setup(); "
            "print(json.dumps([s.CELERY_BROKER_URL, s.CHANNEL_LAYERS['default']['CONFIG']['hosts'][0]['address'], "
            "s.CACHES['default']['LOCATION'], s.CACHES['default']['OPTIONS']['serializer'], s.CELERY_ACCEPT_CONTENT]))")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DAY0_")}
    env.update(DJANGO_SETTINGS_MODULE="day0portal.settings", DAY0_DATA_DIR=str(tmp_path),
               DAY0_REDIS_URL="redis://:pw@cache:6379/0")
    for broker, expected in (("amqp://day0:pw@rabbitmq:5672/day0", "amqp://day0:pw@rabbitmq:5672/day0"),
                             ("", "redis://:pw@cache:6379/0")):
        out = subprocess.run([sys.executable, "-c", code], env=dict(env, DAY0_BROKER_URL=broker), capture_output=True,
                             text=True, check=True).stdout
        assert json.loads(out) == [expected, "redis://:pw@cache:6379/0", "redis://:pw@cache:6379/0",
                                   "day0portal.cache.JSONSerializer", ["json"]]
