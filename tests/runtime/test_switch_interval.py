"""The serving process's thread switch interval: ``DAY0_SWITCH_INTERVAL_S`` (empty: 0.5 ms, ``default``: Python's
own), applied by ``serve`` before the server runs, and a bad value refused by ``day0 serve`` naming it."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from agents.runtime.server import launcher
from agents.runtime.server.launcher import DEFAULT_SWITCH_INTERVAL_S, switch_interval_from_env


@pytest.mark.parametrize(("raw", "expected"), [
    ("", DEFAULT_SWITCH_INTERVAL_S), ("  ", DEFAULT_SWITCH_INTERVAL_S), ("0.001", 0.001), ("2e-4", 0.0002),
    ("default", None), ("DEFAULT", None),
])
def test_the_interval_is_read_from_the_environment(monkeypatch, raw, expected):
    monkeypatch.setenv("DAY0_SWITCH_INTERVAL_S", raw)
    assert switch_interval_from_env() == expected


@pytest.mark.parametrize("raw", ["fast", "0", "-0.001", "nan", "inf", "1", "0.000001"])
def test_a_bad_interval_is_a_value_error_naming_the_variable(monkeypatch, raw):
    monkeypatch.setenv("DAY0_SWITCH_INTERVAL_S", raw)
    with pytest.raises(ValueError, match=r"DAY0_SWITCH_INTERVAL_S must be seconds in \[0.00001, 0.1\]"):
        switch_interval_from_env()


class _FakeServer:
    def __init__(self) -> None:
        self.config = SimpleNamespace(app=SimpleNamespace(state=SimpleNamespace(runtime=SimpleNamespace(error=None))))
        self.seen: float | None = None

    def run(self) -> None:
        self.seen = sys.getswitchinterval()


@pytest.mark.parametrize(("raw", "expected"), [("", DEFAULT_SWITCH_INTERVAL_S), ("0.002", 0.002)])
def test_serve_sets_the_interval_before_the_server_runs(monkeypatch, raw, expected):
    before = sys.getswitchinterval()
    fake = _FakeServer()
    monkeypatch.setattr(launcher, "build_server", lambda *a, **k: fake)
    monkeypatch.setenv("DAY0_SWITCH_INTERVAL_S", raw)
    try:
        assert launcher.serve("unused") == 0
        assert fake.seen == pytest.approx(expected)
    finally:
        sys.setswitchinterval(before)


def test_default_leaves_pythons_interval_alone(monkeypatch):
    before = sys.getswitchinterval()
    fake = _FakeServer()
    monkeypatch.setattr(launcher, "build_server", lambda *a, **k: fake)
    monkeypatch.setenv("DAY0_SWITCH_INTERVAL_S", "default")
    assert launcher.serve("unused") == 0
    assert fake.seen == before


def test_day0_serve_refuses_a_bad_interval_before_it_serves(monkeypatch, tmp_path, capsys):
    from day0portal.cli import main

    (tmp_path / "config.json").write_text("{}")
    monkeypatch.setenv("DAY0_SWITCH_INTERVAL_S", "soon")
    monkeypatch.setattr(launcher, "serve", lambda *a, **k: pytest.fail("served with a bad interval"))
    assert main(["serve", str(tmp_path), "--allocator", "system"]) == 2
    assert "DAY0_SWITCH_INTERVAL_S must be seconds" in capsys.readouterr().out
