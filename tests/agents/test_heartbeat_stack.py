"""The agent's heartbeat re-reads its environment lock every ``lock_every`` beats and sends it as ``versions``
(a driver upgraded under a running agent reaches the portal's stack comparison); other beats stay small."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from agents.worker.agent_state import AgentState
from agents.worker.heartbeat import Heartbeat


def test_every_nth_beat_carries_the_environment_lock() -> None:
    bodies: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            payload = b"{}"
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        state = AgentState(portal_url=f"http://127.0.0.1:{server.server_address[1]}", token="t", hardware="hw",
                           hostname="h", device="cpu", agent_id=7)
        beat = Heartbeat(state, interval=0.05, lock_every=3).start()
        deadline = time.monotonic() + 20
        while len(bodies) < 6 and time.monotonic() < deadline:
            time.sleep(0.05)
        beat.stop()
    finally:
        server.shutdown()
        server.server_close()
    with_lock = [i for i, b in enumerate(bodies[:6]) if "versions" in b]
    assert with_lock == [2, 5]
    lock = bodies[2]["versions"]
    import torch

    assert lock["torch"] == torch.__version__ and "runtime_commit" in lock and "driver" in lock
