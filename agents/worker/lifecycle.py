"""How agent processes end: with their parent, and within seconds of SIGTERM whatever the portal and broker do.

* ``die_with_parent()`` (a ``preexec_fn``, or called first thing in a child): on Linux the kernel sends the
  child SIGTERM when its parent dies, even by SIGKILL (``prctl(PR_SET_PDEATHSIG)``); elsewhere a thread watches
  the parent's pid and sends it.
* ``install_stop_on_shutdown(state)``: when the Celery worker starts its shutdown (SIGTERM, Ctrl-C), the agent
  sets ``state.stopping`` (the task stops its pipeline between steps and its retry loops give up; what is not
  delivered stays in the spool and outbox on disk) and arms a watchdog that ends the process, and the processes
  it started, after ``DAY0_AGENT_STOP_SECONDS`` even if a call is stuck on a dead portal or broker."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1


def stop_grace_seconds() -> float:
    raw = os.environ.get("DAY0_AGENT_STOP_SECONDS", "5")
    try:
        value = float(raw)
    except ValueError:
        raise SystemExit(f"DAY0_AGENT_STOP_SECONDS={raw!r} is not a number of seconds") from None
    return min(max(value, 0.5), 600.0)


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask for ``sig`` when the parent process dies (Linux: PR_SET_PDEATHSIG; elsewhere a watching thread)."""
    parent = os.getppid()
    if sys.platform.startswith("linux"):
        import ctypes

        if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig)) == 0:
            if os.getppid() != parent:  # the parent died before prctl took effect
                os.kill(os.getpid(), sig)
            return

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os.kill(os.getpid(), sig)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def child_pids(pid: int | None = None) -> list[int]:
    """Direct children of ``pid`` (default: this process), from /proc; empty where /proc is absent."""
    pid = os.getpid() if pid is None else pid
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields and int(fields[1]) == pid:
            children.append(int(stat.parent.name))
    return children


def kill_children(sig: int = signal.SIGKILL) -> None:
    for child in child_pids():
        try:
            os.kill(child, sig)
        except ProcessLookupError:
            pass


def _watchdog(grace: float) -> None:
    time.sleep(grace)
    logger.error("agent still running %.0f s after the shutdown began; exiting now", grace)
    kill_children()
    os._exit(143)


def begin_stop(state: Any, grace: float | None = None) -> None:
    """Marks the agent stopping, cancels its running job and arms the exit watchdog (once)."""
    if state.stopping.is_set():
        return
    state.stopping.set()
    cancel = getattr(state, "cancel_event", None)
    if cancel is not None:
        cancel.set()
    threading.Thread(target=_watchdog, args=(grace or stop_grace_seconds(),), name="stop-watchdog",
                     daemon=True).start()


def install_stop_on_shutdown(state: Any) -> None:
    """Connects ``begin_stop`` to Celery's ``worker_shutting_down`` signal (sent from its SIGTERM/SIGINT handler)."""
    from celery.signals import worker_shutting_down

    def on_shutdown(**_: Any) -> None:
        begin_stop(state)

    worker_shutting_down.connect(on_shutdown, weak=False)
