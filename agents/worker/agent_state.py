"""The running agent's identity and settings, shared by the task, the heartbeat thread and the command.

Read from ``DAY0_AGENT_*`` environment variables (``day0 agent`` sets them from its options before the worker
starts), so a worker child process sees the same values as the parent.

Spool and work folders belong to one portal and one agent: ``<root>/<portal>/<hardware>@<hostname>/`` where
``<root>`` is ``DAY0_AGENT_SPOOL_DIR`` (``DAY0_AGENT_WORK_DIR``), by default ``$DAY0_DATA_DIR/agent/spool``
(``…/work``), and ``<portal>`` is the portal's host and port plus a digest of its URL. Two portals (two demos
from one checkout) or two agents on one host never share a job's files."""

from __future__ import annotations

import hashlib
import os
import re
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

_ROOT = Path(__file__).resolve().parents[2]


def _default_device() -> str:
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:
        return "cpu"


def data_dir() -> Path:
    return Path(os.environ.get("DAY0_DATA_DIR") or _ROOT / "var").resolve()


def _safe(text: str, limit: int = 80) -> str:
    return re.sub(r"[^A-Za-z0-9._@-]+", "_", text)[:limit] or "_"


def portal_key(portal_url: str) -> str:
    """``<host>_<port>-<digest>``: readable, and distinct for every portal URL."""
    parts = urlsplit(portal_url.strip())
    port = parts.port or (443 if parts.scheme == "https" else 80)
    digest = hashlib.sha256(portal_url.strip().rstrip("/").lower().encode()).hexdigest()[:10]
    return f"{_safe(parts.hostname or 'portal', 60)}_{port}-{digest}"


def agent_key(hardware: str, hostname: str) -> str:
    """The agent's identity at a portal (registration is idempotent on hardware and host name)."""
    return _safe(f"{hardware or 'any'}@{hostname}")


@dataclass
class AgentState:
    portal_url: str = field(default_factory=lambda: os.environ.get("DAY0_AGENT_PORTAL", "http://127.0.0.1:8000"))
    token: str = field(default_factory=lambda: os.environ.get("DAY0_AGENT_TOKEN", ""))
    hardware: str = field(default_factory=lambda: os.environ.get("DAY0_AGENT_HARDWARE", ""))
    hostname: str = field(default_factory=lambda: os.environ.get("DAY0_AGENT_HOSTNAME") or socket.gethostname())
    models_dir: str = field(default_factory=lambda: os.environ.get("DAY0_AGENT_MODELS_DIR", ""))
    spool_root: str = field(default_factory=lambda: os.environ.get("DAY0_AGENT_SPOOL_DIR")
                            or str(data_dir() / "agent" / "spool"))
    work_root: str = field(default_factory=lambda: os.environ.get("DAY0_AGENT_WORK_DIR")
                           or str(data_dir() / "agent" / "work"))
    device: str = field(default_factory=lambda: os.environ.get("DAY0_AGENT_DEVICE") or _default_device())
    agent_id: int | None = field(default_factory=lambda: int(os.environ["DAY0_AGENT_ID"]) if os.environ.get(
        "DAY0_AGENT_ID") else None)
    current_job: int | None = None
    # set when the worker begins its shutdown: loops that wait for the portal give up, the pipeline stops
    stopping: threading.Event = field(default_factory=threading.Event)
    cancel_event: threading.Event | None = None  # the running job's (``StageContext.cancel_event``)

    def _scoped(self, root: str) -> Path:
        return Path(root) / portal_key(self.portal_url) / agent_key(self.hardware, self.hostname)

    @property
    def spool_dir(self) -> Path:
        """Where this agent spools its jobs' events and results for this portal."""
        return self._scoped(self.spool_root)

    @property
    def work_dir(self) -> Path:
        return self._scoped(self.work_root)


STATE = AgentState()
