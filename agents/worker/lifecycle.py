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
    grace = grace or stop_grace_seconds()
    logger.warning("agent stopping: %s; exiting within %.0f s", "cancelling the running job" if cancel is not None
                   else "no job running", grace)
    threading.Thread(target=_watchdog, args=(grace,), name="stop-watchdog", daemon=True).start()


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)


def install_stop_on_shutdown(state: Any) -> None:
    """``begin_stop`` as soon as a stop signal arrives, and when Celery's ``worker_shutting_down`` fires.

    Python runs signal handlers in the main thread between bytecodes, and the solo pool runs the job there: a long
    torch call would hold Celery's SIGTERM handler back for as long as it lasts. The C-level handler writes the
    signal number to the wakeup fd at once, so a thread reading it starts the stop (cancel, watchdog) without
    waiting for the main thread. Call it from the main thread."""
    from celery.signals import worker_shutting_down

    def on_shutdown(**_: Any) -> None:
        begin_stop(state)

    worker_shutting_down.connect(on_shutdown, weak=False)
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)

    def watch() -> None:
        while True:
            received = os.read(read_fd, 64)
            if not received:
                return
            if any(sig in STOP_SIGNALS for sig in received):
                begin_stop(state)

    threading.Thread(target=watch, name="stop-signals", daemon=True).start()
