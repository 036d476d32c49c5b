"""The agent's durable event spool: a job's events are appended to a local file before they are sent, and
stay there until the portal acknowledges them, so a portal outage (or an agent restart) loses nothing.

Files per job, under the spool folder:

* ``job-<id>.events.jsonl`` — append-only, one event per line ``{seq, ts, stage, kind, level, message, data}``;
* ``job-<id>.acked`` — the highest seq the portal acknowledged as stored contiguously (replaced atomically).

* ``job-<id>.identity`` — which job of which portal the files belong to (the job's creation time there); files
  of another job that had the same id (a reset portal database) are moved to ``stale/`` instead of being sent.

Seqs are assigned here, monotonically per job, continuing after the highest seq already in the file or
acknowledged by the portal (a re-queued job continues its log, never rewrites it). The sender posts pending
events in seq order in batches; the portal stores idempotently on (job, seq), so a resend after a timeout
never duplicates, and the answer (highest contiguous seq) tells which events may be forgotten.

The portal's acknowledgement is the truth: when it holds fewer events than the spool thought, the events it
misses are read back from the file and sent again; when the file no longer has them, ``send_once`` raises
``SpoolGap`` and the sender stops (the job fails naming the gap) instead of re-posting a batch the portal can
never acknowledge. While the portal is away the sender backs off (up to ``max_backoff``); new events and
``flush`` do not cut a backoff short.
"""

from __future__ import annotations

import json
import logging
import os
import random
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from contract.events import EVENT_MESSAGE_MAX

logger = logging.getLogger(__name__)

# post(job_id, events) -> highest contiguous seq the portal stored; raises on any failure to deliver
PostEvents = Callable[[int, list[dict[str, Any]]], int]


class SpoolGap(Exception):
    """The portal misses events this spool no longer holds: re-posting cannot fix it."""


def claim_job_files(folder: Path, job_id: int, identity: str | None) -> None:
    """Makes ``folder``'s ``job-<id>.*`` files this job's: files recorded for another identity (a job with the same
    id at a reset portal) are moved to ``folder/stale/`` with a timestamp; the identity is recorded."""
    if identity is None:
        return
    folder.mkdir(parents=True, exist_ok=True)
    marker = folder / f"job-{job_id}.identity"
    try:
        recorded = marker.read_text()
    except FileNotFoundError:
        recorded = None
    if recorded == identity:
        return
    if recorded is not None or any(folder.glob(f"job-{job_id}.*")):
        stale = folder / "stale"
        stale.mkdir(exist_ok=True)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%f")
        for path in folder.glob(f"job-{job_id}.*"):
            os.replace(path, stale / f"{path.name}.{stamp}")
        logger.warning("spool %s: files of job %s belonged to another job (%r, now %r); moved to %s", folder,
                       job_id, recorded, identity, stale)
    tmp = marker.with_suffix(".identity.tmp")
    tmp.write_text(identity)
    os.replace(tmp, marker)


def open_for_append(path: Path) -> Any:
    """``path`` opened for appending lines; a torn last line (a kill mid-write) is ended first, so the next line
    does not run into it."""
    if path.exists() and path.stat().st_size:
        with path.open("rb") as fh:
            fh.seek(-1, os.SEEK_END)
            torn = fh.read(1) != b"\n"
        if torn:
            with path.open("a", encoding="utf-8") as fh:
                fh.write("\n")
    return path.open("a", encoding="utf-8")


def sync_and_close(file: Any) -> None:
    """Flushed to the disk, not only the page cache, then closed."""
    file.flush()
    os.fsync(file.fileno())
    file.close()


def release_job_files(folder: Path, job_id: int) -> None:
    """Drops the job's identity marker once nothing else of the job is left in ``folder``."""
    marker = folder / f"job-{job_id}.identity"
    if not any(p != marker for p in folder.glob(f"job-{job_id}.*")):
        marker.unlink(missing_ok=True)


class JobSpool:
    """The spool of one job. ``append`` is thread-safe and never blocks on the network."""

    def __init__(self, folder: Path, job_id: int, *, portal_acked: int | None = None,
                 identity: str | None = None) -> None:
        """``portal_acked``: what the portal says it holds (the truth when given); ``identity``: see
        ``claim_job_files``."""
        self.job_id = job_id
        folder.mkdir(parents=True, exist_ok=True)
        claim_job_files(folder, job_id, identity)
        self.events_path = folder / f"job-{job_id}.events.jsonl"
        self.acked_path = folder / f"job-{job_id}.acked"
        self._lock = threading.Lock()
        self._pending: list[dict[str, Any]] = []
        self.acked = self._read_acked() if portal_acked is None else portal_acked
        last = max(self.acked, self._read_acked())
        if self.events_path.exists():
            for event in self._read_events():
                last = max(last, event["seq"])
                if event["seq"] > self.acked:
                    self._pending.append(event)
        self._pending.sort(key=lambda e: e["seq"])
        self._next_seq = last + 1
        self._file = open_for_append(self.events_path)
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
                     "level": level, "message": message[:EVENT_MESSAGE_MAX], "data": data}
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

    def _reload_below(self, acked: int, first_pending: int) -> int:
        """Puts back the file's events in (acked, first_pending) as pending; returns how many it found."""
        with self._lock:
            self._file.flush()
            known = {e["seq"] for e in self._pending}
            missing = [e for e in self._read_events() if acked < e["seq"] < first_pending and e["seq"] not in known]
            unique = {e["seq"]: e for e in missing}
            self._pending = sorted([*unique.values(), *self._pending], key=lambda e: e["seq"])
            self.acked = acked
            self._write_acked(acked)
            return len(unique)

    def send_once(self, post: PostEvents, batch_size: int = 500) -> int:
        """Posts the oldest pending batch; returns how many events the portal newly acknowledged.

        When the answer shows that the portal misses events below the batch, they are read back from the file
        (and sent next); raises ``SpoolGap`` when the file does not have them either."""
        batch = self.pending(batch_size)
        if not batch:
            return 0
        before = self.acked
        acked = post(self.job_id, batch)
        first = batch[0]["seq"]
        if acked < first - 1:
            found = self._reload_below(acked, first)
            if found < first - 1 - acked:
                raise SpoolGap(f"the portal holds events of job {self.job_id} up to seq {acked}, but this agent's "
                               f"spool ({self.events_path}) has only {found} of seqs {acked + 1}-{first - 1}: "
                               "those events are lost")
            logger.warning("job %s: the portal holds events up to seq %s only; resending %s from the spool",
                           self.job_id, acked, found)
            return 0
        self.mark_acked(acked)
        return self.acked - before

    def close(self, *, remove_if_acked: bool = True) -> None:
        with self._lock:
            sync_and_close(self._file)
            done = not self._pending
        if remove_if_acked and done:
            self.events_path.unlink(missing_ok=True)
            self.acked_path.unlink(missing_ok=True)


class SpoolSender:
    """A background thread that drains a ``JobSpool`` to the portal, retrying with backoff while it is away.

    ``retryable(exc)`` says whether a failed post is worth retrying (the portal is away); any other failure, and
    a ``SpoolGap``, stops the sender for good with ``fatal`` set: a batch the portal refuses is not re-posted."""

    def __init__(self, spool: JobSpool, post: PostEvents, *, interval: float = 0.2, batch_size: int = 500,
                 max_backoff: float = 5.0, retryable: Callable[[Exception], bool] | None = None) -> None:
        self.spool = spool
        self.post = post
        self.interval = interval
        self.batch_size = batch_size
        self.max_backoff = max_backoff
        self.retryable = retryable or (lambda exc: not isinstance(exc, SpoolGap))
        self.failures = 0
        self.posts = 0
        self.last_error: str | None = None
        self.fatal: str | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._round = threading.Condition()
        self._rounds = 0
        self._thread = threading.Thread(target=self._loop, name=f"spool-{spool.job_id}", daemon=True)

    def start(self) -> SpoolSender:
        self._thread.start()
        return self

    def wake(self) -> None:
        """New events: send soon (unless the sender is backing off from a failure)."""
        self._wake.set()

    def _counting_post(self, job_id: int, events: list[dict[str, Any]]) -> int:
        self.posts += 1
        return self.post(job_id, events)

    def _loop(self) -> None:
        backoff = self.interval
        while not self._stop.is_set():
            failing = False
            try:
                while self.spool.send_once(self._counting_post, self.batch_size) and not self._stop.is_set():
                    pass
                backoff = self.interval
                self.last_error = None
            except Exception as exc:  # noqa: BLE001 — the portal is away (events stay spooled) or refused them
                self.last_error = f"{type(exc).__name__}: {exc}"
                if not self.retryable(exc):
                    self.fatal = self.last_error
                    logger.error("job %s: event delivery stopped: %s", self.spool.job_id, self.fatal)
                    self._end_round()
                    return
                self.failures += 1
                failing = True
                backoff = min(backoff * 2, self.max_backoff)
                logger.warning("job %s: event post failed (%s); retrying in %.1fs", self.spool.job_id,
                               self.last_error, backoff)
            self._end_round()
            if failing:
                self._stop.wait(backoff * random.uniform(0.75, 1.0))  # wakes do not cut a backoff short
            else:
                self._wake.wait(self.interval)
            self._wake.clear()

    def _end_round(self) -> None:
        with self._round:
            self._rounds += 1
            self._round.notify_all()

    def flush(self, timeout: float, abort: threading.Event | None = None) -> bool:
        """Waits until every spooled event is acknowledged; False if ``timeout`` seconds pass first, the sender
        stopped for good (``fatal``) or ``abort`` is set. Waiting never adds posts: the sender keeps its pace."""
        deadline = time.monotonic() + timeout
        self.wake()
        while self.spool.pending_count():
            if self.fatal or (abort is not None and abort.is_set()) or not self._thread.is_alive():
                return False
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            with self._round:
                seen = self._rounds
                self._round.wait_for(lambda seen=seen: self._rounds != seen, timeout=min(left, 0.5))
        return True

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=10)
