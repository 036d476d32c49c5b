"""Waiting for a ``day0 serve`` process started by a test: ready, or the end of its log in the failure."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx


def wait_until_ready(url: str, proc: subprocess.Popen, log: Path, timeout: float = 120.0) -> None:
    """Poll ``/ready`` until 200; fail with the server's log when it exits or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise AssertionError(f"{url} not ready after {timeout:.0f} s: " + log.read_text()[-3000:])
