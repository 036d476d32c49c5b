"""``day0 serve --allocator``: tcmalloc preloaded by one re-exec when the host has it, never twice, never from an
in-process call, and a clear refusal when it is insisted on and missing."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from agents.runtime import allocator
from agents.runtime.testing.make_model import cached_model

FAKE = "/opt/fake/libtcmalloc_minimal.so.4"


def test_auto_preloads_tcmalloc_and_huge_pages_when_found(monkeypatch):
    monkeypatch.setattr(allocator, "find_tcmalloc", lambda: FAKE)
    env, said = allocator.plan("auto", {"LD_PRELOAD": "/x/libother.so", "PATH": "/bin"})
    assert env["LD_PRELOAD"] == f"{FAKE}:/x/libother.so"  # ours first, the caller's kept
    assert env["THP_MEM_ALLOC_ENABLE"] == "1" and env[allocator.MARK] == "1" and env["PATH"] == "/bin"
    assert said == f"tcmalloc ({FAKE})"


def test_no_second_exec_and_the_users_choices_stand(monkeypatch):
    monkeypatch.setattr(allocator, "find_tcmalloc", lambda: FAKE)
    assert allocator.plan("auto", {"LD_PRELOAD": FAKE}) == (None, "tcmalloc (preloaded)")
    assert allocator.plan("auto", {allocator.MARK: "1"})[0] is None  # the preload did not take: go on, no loop
    assert allocator.plan("system", {}) == (None, "system malloc (--allocator system)")
    env, _ = allocator.plan("auto", {"THP_MEM_ALLOC_ENABLE": "0"})
    assert env["THP_MEM_ALLOC_ENABLE"] == "0"


def test_missing_tcmalloc(monkeypatch):
    monkeypatch.setattr(allocator, "find_tcmalloc", lambda: None)
    env, said = allocator.plan("auto", {})
    assert env is None and "no tcmalloc on this host" in said
    with pytest.raises(ValueError, match="--allocator tcmalloc: no tcmalloc on this host"):
        allocator.plan("tcmalloc", {})
    with pytest.raises(ValueError, match="--allocator must be one of"):
        allocator.plan("jemalloc", {})


def test_in_process_cli_call_never_re_executes(monkeypatch, tmp_path):
    """``main([...])`` from a test or a script must not replace the calling process."""
    from day0cli.main import main

    monkeypatch.setattr(allocator, "find_tcmalloc", lambda: FAKE)
    monkeypatch.setattr(allocator, "reexec_with", lambda env: pytest.fail("re-executed an in-process call"))
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    assert main(["serve", str(tmp_path)]) == 2  # no config.json: refused before anything else
    monkeypatch.setattr("agents.runtime.server.launcher.serve", lambda *a, **k: 0)
    assert main(["serve", str(cached_model("llama")), "--allocator", "auto"]) == 0


@pytest.mark.skipif(allocator.find_tcmalloc() is None, reason="no tcmalloc on this host")
def test_day0_serve_runs_under_tcmalloc(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", allocator.MARK)}
    log = open(tmp_path / "serve.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "day0cli", "serve", str(cached_model("llama")), "--port",
                             str(port), "--num-blocks", "32"], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=2).status_code == 200:  # warmed up
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        maps = Path(f"/proc/{proc.pid}/maps").read_text()  # the same pid: execve keeps it
        assert "tcmalloc" in maps
        text = (tmp_path / "serve.log").read_text()
        assert "re-executing once to preload it" in text and "allocator: tcmalloc (preloaded)" in text
        body = {"prompt": [5, 6, 7], "max_tokens": 3, "temperature": 0}
        resp = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=60)
        assert resp.status_code == 200, resp.text
        assert resp.json()["usage"]["completion_tokens"] == 3
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
