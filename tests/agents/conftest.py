"""Real processes for the agent tests: the portal (uvicorn, ASGI) on the test PostgreSQL database with the Redis
channel layer and Redis as Celery broker, and agents (``day0 agent``: a real Celery worker) that hold no
database credentials. Each test gets its own hardware slug, hence its own queue ``hw.<slug>``."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.error import URLError
from urllib.request import urlopen

import pytest

from tests.live_services import database_url, free_port

ROOT = Path(__file__).resolve().parents[2]
LOGS = ROOT / "test-artifacts" / "agents"
_SLUGS = itertools.count()


def unique_slug(prefix: str) -> str:
    return f"{prefix}{os.getpid()}x{next(_SLUGS)}"


def _redis_url() -> str:
    url = os.environ.get("DAY0_REDIS_URL")
    if not url:
        pytest.fail("agent tests need Redis (broker and channel layer): set DAY0_REDIS_URL (see `make test`)")
    return url


class PortalProcess:
    """uvicorn serving the portal; ``stop()``/``start()`` simulate an outage on the same port."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        LOGS.mkdir(parents=True, exist_ok=True)
        self.log_path = LOGS / f"portal-{os.getpid()}.log"

    def start(self) -> None:
        env = {**os.environ, "DAY0_DATABASE_URL": database_url("agent tests"), "DAY0_REDIS_URL": _redis_url(),
               "PYTHONUNBUFFERED": "1"}
        log = self.log_path.open("a")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "day0portal.asgi:application", "--host", "127.0.0.1", "--port",
             str(self.port), "--log-level", "warning", "--no-access-log"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 90
        while True:
            if self.proc.poll() is not None:
                pytest.fail(f"portal exited with {self.proc.returncode}; see {self.log_path}")
            try:
                with urlopen(f"{self.url}/healthz", timeout=2) as r:
                    if r.status == 200:
                        return
            except (URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"portal did not answer /healthz in 90 s; see {self.log_path}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


@pytest.fixture(scope="session")
def portal(django_db_setup, django_db_blocker) -> Iterator[PortalProcess]:
    server = PortalProcess()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@dataclass
class AgentProcess:
    proc: subprocess.Popen
    log_path: Path
    spool_dir: Path

    def kill(self) -> None:
        """SIGKILL the whole agent (its process group), as a crashed host would."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()

    def log(self) -> str:
        return self.log_path.read_text()[-6000:] if self.log_path.exists() else ""


@pytest.fixture
def start_agent(portal: PortalProcess, tmp_path: Path) -> Iterator[Callable[..., AgentProcess]]:
    """Starts ``day0 agent`` for a hardware; the environment holds no database settings."""
    agents: list[AgentProcess] = []

    def start(hardware: str, token: str, *, models_dir: Path | None = None, hostname: str | None = None,
              spool_dir: Path | None = None, broker: str | None = None, portal_url: str | None = None,
              extra_env: dict[str, str] | None = None) -> AgentProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DAY0_DATABASE", "DJANGO_"))}
        spool = spool_dir or tmp_path / f"spool-{len(agents)}"
        env.update(DAY0_AGENT_SPOOL_DIR=str(spool), DAY0_AGENT_WORK_DIR=str(tmp_path / "work"),
                   DAY0_AGENT_CANCEL_POLL="0.5", DAY0_AGENT_LOGLEVEL="INFO", PYTHONUNBUFFERED="1",
                   HF_HUB_OFFLINE="1", DAY0_AGENT_DEVICE="cpu", DAY0_AGENT_TOKEN=token,
                   DAY0_AGENT_STOP_SECONDS="2")  # teardown: a stopped agent is gone within 2 s
        env.update(extra_env or {})
        log_path = LOGS / f"agent-{hardware}-{len(agents)}.log"
        cmd = [sys.executable, "-m", "day0cli", "agent", "--hardware", hardware, "--portal", portal_url or portal.url,
               "--broker", broker or _redis_url(), "--heartbeat", "1",
               "--hostname", hostname or f"host-{hardware}"]
        if models_dir is not None:
            cmd += ["--models-dir", str(models_dir)]
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log_path.open("w"), stderr=subprocess.STDOUT,
                                start_new_session=True)
        agent = AgentProcess(proc, log_path, spool)
        agents.append(agent)
        return agent

    yield start
    for agent in agents:
        agent.stop()


@pytest.fixture
def portal_worker(portal: PortalProcess, tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen]]:
    """The portal's Celery worker with beat on a queue of its own (detects lost jobs every second)."""
    from agents.worker.demo import stop_agent
    from day0cli.demo_seed import start_portal_worker

    procs: list[subprocess.Popen] = []

    def start(**env: str) -> subprocess.Popen:
        run_env = {"DAY0_DATABASE_URL": database_url("agent tests"), "DAY0_REDIS_URL": _redis_url(),
                   "DAY0_CELERY_DEFAULT_QUEUE": f"portal{os.getpid()}", "DAY0_DETECT_LOST_EVERY": "1", **env}
        proc = start_portal_worker(env=run_env, log_path=LOGS / f"portal-worker-{os.getpid()}.log")
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        stop_agent(proc)


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, agent: AgentProcess | None = None) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            extra = f"\nagent log:\n{agent.log()}" if agent is not None else ""
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}{extra}")
        time.sleep(0.25)


def model_config(model_dir: Path) -> dict[str, Any]:
    return json.loads((model_dir / "config.json").read_text())
