"""A ``day0 serve`` child process on a free port of 127.0.0.1 (its command line from
``agents.runtime.commands.serve.serve_command``, the one place that builds it): readiness, log tail, stop."""

from __future__ import annotations

import atexit
import os
import subprocess
import time
from pathlib import Path

import httpx

from agents.pipeline.support.errors import Cancellable, StageFailed
from agents.runtime.commands.serve import serve_command

REPO_ROOT = Path(__file__).resolve().parents[3]  # the server runs from the checkout's root


class ServerProcess:
    """A ``day0 serve`` child process; a context manager that stops it."""

    def __init__(
        self,
        model_dir: Path,
        *,
        dtype: str,
        device: str,
        tp: int | None,
        log_path: Path,
        extra_args: list[str] | None = None,
        layout_args: tuple[str, ...] = (),
    ) -> None:
        from agents.runtime.server.launcher import free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.tp = tp or 1
        cmd = serve_command(model_dir, dtype=dtype, device=device, port=self.port,
                            args=[*(["--tp", str(tp)] if tp else []), *(extra_args or []), *layout_args])
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        env.pop("DAY0_API_KEY", None)  # the stage's own server on 127.0.0.1: its clients send no API key
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT
        )
        atexit.register(self.stop)

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def wait_ready(self, timeout: float, ctx: Cancellable | None = None) -> float:
        """Seconds until ``/ready`` answered 200; StageFailed with the log tail if it died or timed out."""
        deadline = self.started + timeout
        while time.monotonic() < deadline:
            if ctx is not None:
                ctx.check_cancelled()
            if self.proc.poll() is not None:
                raise StageFailed(f"server exited with code {self.proc.returncode} before ready:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/ready", timeout=2).status_code == 200:
                    return time.monotonic() - self.started
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise StageFailed(f"server not ready after {timeout:.0f} s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        if not self._log.closed:
            self._log.close()

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
