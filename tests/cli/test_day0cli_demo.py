"""``day0 demo``'s building blocks (``day0cli.demo``): the environment every demo process gets, the refusal of a
port something else listens on, and the portal's stop."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from day0cli.demo import ROOT, SERVER_VARS, _check_port_free, demo_environment, stop_portal


def test_the_demo_environment_is_the_embedded_default_under_its_data_folder(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    for name in SERVER_VARS:
        monkeypatch.setenv(name, "postgres://elsewhere/db")
    monkeypatch.setenv("PYTHONPATH", "/some/where")
    monkeypatch.delenv("DJANGO_SETTINGS_MODULE", raising=False)
    env = demo_environment(tmp_path / "data")
    assert not set(SERVER_VARS) & set(env)  # the demo never runs on a server's database, cache or broker
    assert env["DAY0_DATA_DIR"] == str((tmp_path / "data").resolve())
    assert env["DJANGO_SETTINGS_MODULE"] == "day0portal.settings"
    assert env["PYTHONPATH"].split(os.pathsep) == [str(ROOT), "/some/where"]
    assert (ROOT / "manage.py").is_file()  # ROOT is the checkout the demo's processes start in
    monkeypatch.setenv("DAY0_DATA_DIR", str(tmp_path / "from-env"))
    assert demo_environment()["DAY0_DATA_DIR"] == str((tmp_path / "from-env").resolve())


def test_a_port_in_use_is_refused_naming_it_and_a_free_one_passes() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(RuntimeError, match=rf"^127\.0\.0\.1:{port} is in use .*; choose another with --port$"):
            _check_port_free("127.0.0.1", port)
    _check_port_free("127.0.0.1", port)  # closed: free again


def test_stopping_the_portal_kills_what_ignores_sigterm() -> None:
    stubborn = subprocess.Popen([sys.executable, "-c", "import signal, sys, time\n"
                                 "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\n"
                                 "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    assert stubborn.stdout.readline() == "ready\n"
    stop_portal(stubborn, timeout=0.5)
    assert stubborn.returncode == -9
    stop_portal(stubborn)  # stopped already: nothing to do
