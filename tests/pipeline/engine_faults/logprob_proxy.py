"""A planted engine fault for the endpoint-align tests: a real HTTP server in front of the bundled runtime
(``python -m agents.runtime serve``, started here as its child, in the same process group) that forwards every
request and, by ``--fault``, falsifies the logprobs it returns:

* ``hit``: a completion (not ``echo``) whose prompt it has forwarded before (an engine serving a prefix-cache hit)
  gets every logprob shifted by a deterministic per-token offset in [-0.5, 0.5): a KV cache that changes what
  the engine computes;
* ``blind``: every position's logprobs replaced by the same fixed ones (token ids 0, 1, … at -1, -2, …; the
  chosen token at -3): an engine whose logprobs say nothing of the prompt.

Usage: ``python -m tests.pipeline.engine_faults.logprob_proxy --fault hit --port PORT -- SERVE ARGS…``."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

from agents.runtime.server.launcher import free_port

SEEN: set[str] = set()


def _offset(name: str) -> float:
    return (sum(map(ord, name)) * 7919 % 1000) / 1000 - 0.5


def _shift(block: dict[str, Any]) -> None:
    block["token_logprobs"] = [None if v is None else min(0.0, v + _offset(t))
                               for t, v in zip(block["tokens"], block["token_logprobs"], strict=True)]
    block["top_logprobs"] = [None if top is None else {k: min(0.0, v + _offset(k)) for k, v in top.items()}
                             for top in block["top_logprobs"]]


def _blind(block: dict[str, Any]) -> None:
    tops = []
    for token, top in zip(block["tokens"], block["top_logprobs"], strict=True):
        fixed = {f"token_id:{i}": -1.0 - i for i in range(len(top or ()))}
        tops.append({**fixed, token: -3.0} if top is not None else None)
    block["top_logprobs"] = tops
    block["token_logprobs"] = [None if v is None else -3.0 for v in block["token_logprobs"]]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fault", choices=("hit", "blind"), required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("serve", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    inner_port = free_port()
    serve = [a for a in args.serve if a != "--"]
    child = subprocess.Popen([sys.executable, "-m", "agents.runtime", "serve", *serve, "--port", str(inner_port)])
    inner = f"http://127.0.0.1:{inner_port}"

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, response: httpx.Response, body: bytes | None = None) -> None:
            self.send_response(response.status_code)
            data = body if body is not None else response.content
            self.send_header("Content-Type", response.headers.get("content-type", "application/json"))
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            try:
                self._answer(httpx.get(inner + self.path, timeout=30))
            except httpx.HTTPError:
                self.send_error(503)

        def do_POST(self) -> None:  # noqa: N802
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                response = httpx.post(inner + self.path, content=raw, timeout=600,
                                      headers={"Content-Type": "application/json"})
            except httpx.HTTPError:
                self.send_error(503)
                return
            request = json.loads(raw or b"{}")
            if response.status_code != 200 or self.path != "/v1/completions" or request.get("logprobs") is None:
                self._answer(response)
                return
            key = json.dumps(request.get("prompt"))
            repeat = key in SEEN and not request.get("echo")
            SEEN.add(key)
            body = response.json()
            for choice in body.get("choices") or []:
                block = choice.get("logprobs")
                if isinstance(block, dict) and (args.fault == "blind" or repeat):
                    (_blind if args.fault == "blind" else _shift)(block)
            self._answer(response, json.dumps(body).encode())

        def log_message(self, *_: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    try:
        server.serve_forever()
    finally:
        child.terminate()


if __name__ == "__main__":
    main()
