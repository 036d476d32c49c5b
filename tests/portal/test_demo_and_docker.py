"""`day0 demo` from the command line, and docker/.env.example against the settings."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_env_example_lists_every_variable_the_settings_read() -> None:
    source = (ROOT / "day0portal" / "settings.py").read_text()
    read = set(re.findall(r'env_(?:str|bool|int|list)\("(DAY0_[A-Z_]+)"', source))
    listed = set(re.findall(r"^(DAY0_[A-Z_]+)=", (ROOT / "docker" / ".env.example").read_text(), re.M))
    assert read and read <= listed, sorted(read - listed)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_day0_demo_serves_the_seed_catalog_on_the_embedded_default(tmp_path) -> None:
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DAY0_")}
    process = subprocess.Popen([sys.executable, "-m", "day0portal.cli", "demo", "--port", str(port), "--data-dir",
                                str(tmp_path)], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    try:
        lines: list[str] = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = process.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "Ctrl-C stops it" in line:
                break
        output = "".join(lines)
        assert f"http://127.0.0.1:{port}/" in output, output
        token = re.search(r"API token\s+(\S+)", output).group(1)
        request = urllib.request.Request(f"http://127.0.0.1:{port}/api/v1/matrix/",
                                         headers={"Authorization": f"Token {token}"})
        matrix = json.load(urllib.request.urlopen(request, timeout=10))
        assert len(matrix["models"]) >= 8 and len(matrix["hardware"]) >= 8
        page = urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10).read().decode()
        assert "Compatibility matrix" in page and "deepseek-v3" in page.lower()
        assert (tmp_path / "day0.sqlite3").exists()
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()


@pytest.mark.parametrize("name", ["Dockerfile.portal", "Dockerfile.worker", "Dockerfile.agent", "compose.yaml"])
def test_docker_files_exist(name: str) -> None:
    assert (ROOT / "docker" / name).stat().st_size > 200
