"""A failure on one rank of a tensor-parallel server reaches every rank, and never leaves one waiting.

A rank's collective can only be matched by its peers, so a step that failed on any rank cannot be finished or
retried: the step is abandoned everywhere and the server exits non-zero with the failing rank's error.

- A worker (rank > 0) whose step raises writes its error to the job's error directory and exits at once: its
  sockets close, so rank 0's pending collective raises instead of waiting (NCCL: the group's timeout ends it; a
  shared-memory all-reduce: the abort it sets, or its process found gone).
- Rank 0's ``StepGuard`` turns the failed step into an error naming the rank at fault (the request gets it),
  fails every later step at once, stops broadcasting, and shuts the server down (SIGTERM to itself after the
  responses are out); ``_rank_main`` then exits 1.
- The parent (``serve_tp``) watches the ranks: a worker gone while rank 0 still serves is reported with its
  error, rank 0 is given a grace period to answer the request at fault, and the server's exit code is 1.

``DAY0_INJECT_RANK_FAULT=RANK:STEP`` raises on that rank at that step (fault-injection tests, the soak stage).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

ERROR_DIR_ENV = "DAY0_TP_ERROR_DIR"
FAULT_ENV = "DAY0_INJECT_RANK_FAULT"
EXIT_GRACE_S = 1.0  # rank 0 answers the request at fault before it shuts down


class InjectedFault(RuntimeError):
    """The failure ``DAY0_INJECT_RANK_FAULT`` asked for."""


def inject_fault(rank: int, step: int) -> None:
    """Raise ``InjectedFault`` when ``DAY0_INJECT_RANK_FAULT`` names this rank and step."""
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    want_rank, _, want_step = spec.partition(":")
    try:
        target = (int(want_rank), int(want_step or 1))
    except ValueError:
        raise ValueError(f"{FAULT_ENV}={spec!r} must be RANK:STEP (two integers)") from None
    if target == (rank, step):
        raise InjectedFault(f"fault injected on rank {rank} at step {step} ({FAULT_ENV}={spec})")


def _error_dir() -> Path | None:
    path = os.environ.get(ERROR_DIR_ENV)
    return Path(path) if path else None


ERROR_KEY = "day0/errors"
_SHARED: list[tuple[Any, int]] = []  # (the ranks' rendezvous store, world size) when they span hosts


def share_errors(store: Any, world: int) -> None:
    """Ranks across hosts: also record errors in the ranks' rendezvous store, where rank 0 reads another host's
    (the error folder is this host's only)."""
    _SHARED[:] = [(store, world)]


def record_error(rank: int, message: str) -> None:
    """Leave ``message`` where rank 0 and the parent read it (no-op outside ``serve_tp``)."""
    if _SHARED:
        store, _ = _SHARED[0]
        try:
            store.set(f"{ERROR_KEY}/{rank}", json.dumps({"t": time.time(), "message": message}))
        except RuntimeError:  # rank 0's store is gone already: the local folder still says it
            pass
    folder = _error_dir()
    if folder is None:
        return
    tmp = folder / f"rank{rank}.error.tmp"
    tmp.write_text(message)
    tmp.replace(folder / f"rank{rank}.error")


def _shared_errors() -> list[tuple[float, int, str]]:
    if not _SHARED:
        return []
    store, world = _SHARED[0]
    found = []
    try:
        for rank in range(world):
            key = f"{ERROR_KEY}/{rank}"
            if store.check([key]):
                entry = json.loads(store.get(key))
                found.append((float(entry["t"]), rank, str(entry["message"])))
    except RuntimeError:
        pass
    return found


def read_errors(wait_s: float = 0.0, folder: Path | None = None) -> dict[int, str]:
    """The errors ranks recorded (this host's folder, and other hosts' through the store), first written
    first, waiting up to ``wait_s`` for a first one."""
    folder = folder or _error_dir()
    if folder is None and not _SHARED:
        return {}
    deadline = time.monotonic() + wait_s
    while True:
        entries = _shared_errors()
        if folder is not None:
            entries += [(f.stat().st_mtime_ns / 1e9, int(f.name[4:-6]), f.read_text())
                        for f in folder.glob("rank*.error")]
        found: dict[int, str] = {}
        for _, rank, message in sorted(entries):
            found.setdefault(rank, message)
        if found or time.monotonic() >= deadline:
            return found
        time.sleep(0.05)


_FAILURES: list[str] = []


def failure() -> str | None:
    """Rank 0: why the tensor-parallel server stopped, when a step failed (its exit code is then 1)."""
    return _FAILURES[0] if _FAILURES else None


def fail_worker(rank: int, exc: BaseException) -> None:
    """A worker's step failed: record why and exit now (peers blocked on us see the connection close)."""
    from agents.runtime.distributed import CollectiveAbandoned, abandon_collectives

    message = f"rank {rank}: {type(exc).__name__}: {exc}"
    log.error("step failed on %s\n%s", message, "".join(traceback.format_exception(exc)))
    if not isinstance(exc, CollectiveAbandoned):  # a rank that only saw a peer give up is not the cause
        record_error(rank, message)
    abandon_collectives()  # after the error is written: a peer that stops waiting finds it
    os._exit(1)


class StepGuard:
    """Rank 0's ``execute``: a failed step (its own or a peer's) ends the tensor-parallel server."""

    def __init__(self, runner: Any, execute: Callable[[dict[str, Any]], Any]) -> None:
        self.runner = runner
        self.execute = execute
        self.steps = 0
        self.failure: str | None = None

    def __call__(self, inputs: dict[str, Any]) -> Any:
        if self.failure is not None:
            raise RuntimeError(self.failure)
        self.steps += 1
        try:
            inject_fault(0, self.steps)
            return self.execute(inputs)
        except Exception as exc:
            from agents.runtime.distributed import abandon_collectives

            abandon_collectives()  # peers waiting in a shared-memory all-reduce of this step stop waiting
            peers = read_errors(wait_s=2.0)
            own = f"rank 0: {type(exc).__name__}: {exc}"
            cause = next((msg for r, msg in peers.items() if r != 0), own)
            self.failure = f"tensor-parallel step abandoned on every rank ({cause}); the server is stopping"
            _FAILURES.append(self.failure)
            self.runner.broadcast = None  # the peers are not in step any more: never send them another
            record_error(0, own if cause == own else f"rank 0: stopped after {cause}")
            log.error(self.failure)
            threading.Timer(EXIT_GRACE_S, os.kill, (os.getpid(), signal.SIGTERM)).start()
            raise RuntimeError(self.failure) from exc


def watch_ranks(procs: list[Any], folder: Path, stopping: list[int], grace_s: float = 10.0) -> str | None:
    """The parent's wait: until rank 0 ends. When a worker dies while rank 0 serves, give rank 0 ``grace_s`` to
    answer and stop, then terminate it. Returns the failing rank's error (None on a clean stop)."""
    dead: list[int] = []
    failed_at: float | None = None
    while procs[0].is_alive():
        dead = [r for r, p in enumerate(procs[1:], 1) if p.exitcode not in (None, 0)]
        if dead and not stopping and failed_at is None:
            failed_at = time.monotonic()
            log.error("rank(s) %s exited while rank 0 serves", dead)
        if failed_at is not None and time.monotonic() - failed_at > grace_s:
            procs[0].terminate()
        procs[0].join(0.1)
    errors = read_errors(folder=folder)
    if failed_at is None and 0 not in errors:
        return None  # rank 0 ended on its own: the workers' "connection closed" afterwards is no failure
    causes = [msg for r, msg in errors.items() if not msg.startswith(f"rank {r}: stopped after")]
    codes = [f"rank {r} exited with code {procs[r].exitcode}" for r in dead]
    return (causes or codes or list(errors.values()))[0]
