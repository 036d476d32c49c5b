"""``day0 serve``: once the engine is built, the heap made while starting is frozen (a later full collection walks
only what requests made), and the server then serves."""

from __future__ import annotations

import re
import subprocess
import sys

import httpx

from agents.runtime.server.launcher import free_port
from agents.runtime.testing.make_model import cached_model
from tests.runtime.served import wait_until_ready


def test_day0_serve_freezes_the_heap_made_while_starting_and_serves(tmp_path):
    port, log = free_port(), tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "day0cli", "serve", str(cached_model("llama")), "--port",
                                 str(port), "--num-blocks", "32", "--allocator", "system"],
                                stdout=out, stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_until_ready(url, proc, log)
            frozen = re.search(r"garbage collector: (\d+) objects made while starting frozen", log.read_text())
            assert frozen and int(frozen.group(1)) > 10_000, log.read_text()[-3000:]  # torch's and the model's
            text = log.read_text()
            assert text.index("objects made while starting frozen") < text.index("engine ready")
            body = {"prompt": [5, 6, 7], "max_tokens": 3, "temperature": 0}
            resp = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
            assert resp.status_code == 200, resp.text
            assert resp.json()["usage"]["completion_tokens"] == 3
        finally:
            proc.terminate()
            proc.wait(timeout=30)
