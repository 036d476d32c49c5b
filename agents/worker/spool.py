"""The agent's durable event spool: a job's events are appended to a local file before they are sent, and
stay there until the portal acknowledges them, so a portal outage (or an agent restart) loses nothing.

Files per job, under the spool folder:

* ``job-<id>.events.jsonl`` — append-only, one event per line ``{seq, ts, stage, kind, level, message, data}``;
* ``job-<id>.acked`` — the highest seq the portal acknowledged as stored contiguously (replaced atomically).

Seqs are assigned here, monotonically per job, continuing after the highest seq already in the file or
acknowledged by the portal (a re-queued job continues its log, never rewrites it). The sender posts pending
events in seq order in batches; the portal stores idempotently on (job, seq), so a resend after a timeout
never duplicates, and the answer (highest contiguous seq) tells which events may be forgotten.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

# post(job_id, events) -> highest contiguous seq the portal stored; raises on any failure to deliver
PostEvents = Callable[[int, list[dict[str, Any]]], int]


class JobSpool:
    """The spool of one job. ``append`` is thread-safe and never blocks on the network."""

    def __init__(self, folder: Path, job_id: int, *, portal_acked: int = 0) -> None:
        self.job_id = job_id
        folder.mkdir(parents=True, exist_ok=True)
        self.events_path = folder / f"job-{job_id}.events.jsonl"
        self.acked_path = folder / f"job-{job_id}.acked"
        self._lock = threading.Lock()
        self._pending: list[dict[str, Any]] = []
        self.acked = max(self._read_acked(), portal_acked)
        last = self.acked
        if self.events_path.exists():
            for event in self._read_events():
                last = max(last, event["seq"])
                if event["seq"] > self.acked:
                    self._pending.append(event)
        self._pending.sort(key=lambda e: e["seq"])
        self._next_seq = last + 1
        self._file = self.events_path.open("a", encoding="utf-8")
        self._dirty = False

    # ------------------------------------------------------------------ files

    def _read_acked(self) -> int:
        try:
            return int(self.acked_path.read_text().strip() or 0)
        except (FileNotFoundError, ValueError):
            return 0

    def _read_events(self) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        with self.events_path.open(encoding="utf-8") as fh:
            for line in fh:
                try:
                    events.append(json.loads(line))
                except json.JSONDecodeError:
                    # only the last line can be torn (a kill mid-write); everything before it was complete
                    logger.warning("spool %s: skipping a torn line", self.events_path)
        return events

    def _write_acked(self, acked: int) -> None:
        tmp = self.acked_path.with_suffix(".acked.tmp")
        tmp.write_text(str(acked))
        os.replace(tmp, self.acked_path)

    # ------------------------------------------------------------------ producer side

    def append(self, *, stage: str, kind: str, message: str, level: str = "info", data: dict | None = None) -> int:
        """Adds one event with the next seq and returns that seq."""
        with self._lock:
            seq = self._next_seq
            self._next_seq += 1
            event = {"seq": seq, "ts": datetime.now(UTC).isoformat(), "stage": stage[:32], "kind": kind[:32],
                     "level": level, "message": message, "data": data}
            self._file.write(json.dumps(event, default=str) + "\n")
            self._file.flush()  # in the OS page cache: survives the process being killed
            self._dirty = True
            self._pending.append(event)
            return seq

    @property
    def last_seq(self) -> int:
        with self._lock:
            return self._next_seq - 1

    def pending(self, limit: int) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._pending[:limit])

    def pending_count(self) -> int:
        with self._lock:
            return len(self._pending)

    # ------------------------------------------------------------------ sender side

    def mark_acked(self, acked: int) -> None:
        """Forget every event up to ``acked`` (the portal stored them all)."""
        with self._lock:
            if self._dirty:
                os.fsync(self._file.fileno())
                self._dirty = False
            if acked <= self.acked:
                return
            self.acked = acked
            self._pending = [e for e in self._pending if e["seq"] > acked]
            self._write_acked(acked)

    def send_once(self, post: PostEvents, batch_size: int = 500) -> int:
        """Posts the oldest pending batch; returns how many events the portal newly acknowledged."""
        batch = self.pending(batch_size)
        if not batch:
            return 0
        before = self.acked
        acked = post(self.job_id, batch)
        self.mark_acked(acked)
        if acked < batch[0]["seq"] - 1:
            # the portal misses events below this batch that we no longer hold: nothing we can resend
            logger.error("job %s: portal acknowledges seq %s but the spool starts at %s", self.job_id, acked,
                         batch[0]["seq"])
        return self.acked - before

    def close(self, *, remove_if_acked: bool = True) -> None:
        with self._lock:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            done = not self._pending
        if remove_if_acked and done:
            self.events_path.unlink(missing_ok=True)
            self.acked_path.unlink(missing_ok=True)


class SpoolSender:
    """A background thread that drains a ``JobSpool`` to the portal, retrying with backoff while it is away."""

    def __init__(self, spool: JobSpool, post: PostEvents, *, interval: float = 0.2, batch_size: int = 500,
                 max_backoff: float = 5.0) -> None:
        self.spool = spool
        self.post = post
        self.interval = interval
        self.batch_size = batch_size
        self.max_backoff = max_backoff
        self.failures = 0
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"spool-{spool.job_id}", daemon=True)

    def start(self) -> SpoolSender:
        self._thread.start()
        return self

    def wake(self) -> None:
        self._wake.set()

    def _loop(self) -> None:
        backoff = self.interval
        while not self._stop.is_set():
            try:
                while self.spool.send_once(self.post, self.batch_size) and not self._stop.is_set():
                    pass
                backoff = self.interval
                self.last_error = None
            except Exception as exc:  # noqa: BLE001 — the portal is away; the events stay spooled
                self.failures += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                logger.warning("job %s: event post failed (%s); retrying in %.1fs", self.spool.job_id,
                               self.last_error, backoff)
                backoff = min(backoff * 2, self.max_backoff)
            self._wake.wait(backoff)
            self._wake.clear()

    def flush(self, timeout: float) -> bool:
        """Waits until every spooled event is acknowledged; False if ``timeout`` seconds pass first."""
        deadline = time.monotonic() + timeout
        while self.spool.pending_count():
            if time.monotonic() > deadline:
                return False
            self.wake()
            time.sleep(0.05)
        return True

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=10)
