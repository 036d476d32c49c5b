"""What tests that start real servers share: a free local port and the test database's URL for child processes."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest
from django.conf import settings


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def database_url(purpose: str) -> str:
    """``postgres://…`` of the test database, for processes started by a test (``purpose`` names them in the
    failure when the suite does not run on PostgreSQL)."""
    db = settings.DATABASES["default"]
    if "postgresql" not in db["ENGINE"]:
        pytest.fail(f"{purpose} need PostgreSQL: set DAY0_DATABASE_URL=postgres://… (see `make test`)")
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    return (f"postgres://{db.get('USER') or 'postgres'}{password}@{db.get('HOST') or '127.0.0.1'}:"
            f"{db.get('PORT') or 5432}/{db['NAME']}")


def start_demo(data_dir: Path, *args: str, until: str, timeout: float = 240) -> tuple[subprocess.Popen, list[str]]:
    """``day0 demo --data-dir DATA_DIR ARGS…`` on a free port with no ``DAY0_*`` settings of the suite, read until
    a line matches the regex ``until`` (then its output keeps being read into the list, so the demo never blocks
    on a full pipe). Fails the test with the output's tail when the line does not come within ``timeout`` s."""
    import re
    import sys
    import threading
    import time

    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DAY0_") or k == "DAY0_TEST_MODELS_DIR"}
    process = subprocess.Popen([sys.executable, "-m", "day0cli", "demo", "--port", str(free_port()),
                                "--data-dir", str(data_dir), *args], cwd=root, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        lines.append(line)
        if re.search(until, line):
            threading.Thread(target=lambda: lines.extend(process.stdout), daemon=True).start()
            return process, lines
    process.kill()
    pytest.fail(f"day0 demo never printed {until!r}:\n" + "".join(lines[-40:]))
