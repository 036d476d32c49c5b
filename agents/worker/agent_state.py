"""The running agent's identity and settings, shared by the task, the heartbeat thread and the command.

Read from ``DAY0_AGENT_*`` environment variables (``day0 agent`` sets them from its options before the worker
starts), so a worker child process sees the same values as the parent."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

_VAR = Path(__file__).resolve().parents[2] / "var" / "agent"


def _default_device() -> str:
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:
        return "cpu"


@dataclass
class AgentState:
    portal_url: str = field(default_factory=lambda: os.environ.get("DAY0_AGENT_PORTAL", "http://127.0.0.1:8000"))
    token: str = field(default_factory=lambda: os.environ.get("DAY0_AGENT_TOKEN", ""))
    hardware: str = field(default_factory=lambda: os.environ.get("DAY0_AGENT_HARDWARE", ""))
    hostname: str = field(default_factory=lambda: os.environ.get("DAY0_AGENT_HOSTNAME") or socket.gethostname())
    models_dir: str = field(default_factory=lambda: os.environ.get("DAY0_AGENT_MODELS_DIR", ""))
    spool_dir: str = field(default_factory=lambda: os.environ.get("DAY0_AGENT_SPOOL_DIR", str(_VAR / "spool")))
    work_dir: str = field(default_factory=lambda: os.environ.get("DAY0_AGENT_WORK_DIR", str(_VAR / "work")))
    device: str = field(default_factory=lambda: os.environ.get("DAY0_AGENT_DEVICE") or _default_device())
    agent_id: int | None = field(default_factory=lambda: int(os.environ["DAY0_AGENT_ID"]) if os.environ.get(
        "DAY0_AGENT_ID") else None)
    current_job: int | None = None


STATE = AgentState()
