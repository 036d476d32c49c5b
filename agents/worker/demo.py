"""Agent-side helpers of ``day0 demo`` (and the end-to-end benchmark): start and stop a CPU agent on the embedded
default, and submit a job over REST. No Django and no database here: what the demo seeds into the portal (the
tiny model's release, the agent token) lives in ``day0cli.demo_seed``.

The agent and the portal share the kombu filesystem broker under ``$DAY0_DATA_DIR/broker``. The agent gets its
token through its environment (``DAY0_AGENT_TOKEN``), never its command line, so ``ps`` does not show it; it
gets SIGTERM when the process that started it dies (``lifecycle.die_with_parent``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from agents.worker.agent_state import data_dir
from agents.worker.lifecycle import die_with_parent

ROOT = Path(__file__).resolve().parents[2]


def agent_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The agent's environment: the embedded broker folder, and no database or Django settings."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DAY0_DATABASE", "DJANGO_", "DAY0_SECRET"))}
    env.update(DAY0_DATA_DIR=str(data_dir()), HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.update(extra or {})
    return env


def start_agent(portal_url: str, token: str, *, hardware: str = "cpu", models_dir: Path | None = None,
                log_path: Path | None = None, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, Path]:
    """Starts ``day0 agent`` (as ``python -m agents.worker agent``) in its own process group, the token in its
    environment; returns the process and its log file."""
    log_path = log_path or data_dir() / "logs" / f"agent-{hardware}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "agents.worker", "agent", "--hardware", hardware, "--portal", portal_url,
               "--device", "cpu"]
    if models_dir is not None:
        command += ["--models-dir", str(models_dir)]
    process = subprocess.Popen(command, cwd=ROOT, env={**agent_environment(env), "DAY0_AGENT_TOKEN": token},
                               stdout=log_path.open("a"), stderr=subprocess.STDOUT, start_new_session=True,
                               preexec_fn=die_with_parent)
    return process, log_path


def submit_job(portal_url: str, token: str, *, model: str, hardware: str = "cpu", stages: list[str] | None = None,
               dtype: str = "float32", **spec: Any) -> dict[str, Any]:
    """POST ``/api/v1/jobs/``; raises ``RuntimeError`` with the portal's answer when refused."""
    body: dict[str, Any] = {"model": model, "hardware": hardware, "dtype": dtype, **spec}
    if stages:
        body["stages"] = stages
    response = httpx.post(f"{portal_url.rstrip('/')}/api/v1/jobs/", json=body, timeout=30,
                          headers={"Authorization": f"Token {token}"})
    if response.status_code != 201:
        raise RuntimeError(f"job submission refused ({response.status_code}): {response.text[:500]}")
    return response.json()


def _signal(process: subprocess.Popen, sig: int) -> None:
    """``sig`` to the process's group when it leads one (``start_new_session``), else to the process."""
    try:
        if os.getpgid(process.pid) == process.pid:
            os.killpg(process.pid, sig)
        else:
            process.send_signal(sig)
    except ProcessLookupError:
        pass


def stop_processes(processes: list[subprocess.Popen], timeout: float = 8.0) -> None:
    """Stops processes together (an agent from ``start_agent`` and the portal's worker with their process
    groups): SIGTERM to all at once, then SIGKILL to what is left after ``timeout`` seconds in all."""
    running = [p for p in processes if p.poll() is None]
    for process in running:
        _signal(process, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for process in running:
        try:
            process.wait(timeout=max(deadline - time.monotonic(), 0.05))
        except subprocess.TimeoutExpired:
            _signal(process, signal.SIGKILL)
            process.wait()


def stop_agent(process: subprocess.Popen, timeout: float = 8.0) -> None:
    """Stops an agent started by ``start_agent`` (its whole process group)."""
    stop_processes([process], timeout)
