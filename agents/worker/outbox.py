"""The agent's durable results outbox: a job's stage sections wait on disk, in order, until the portal took them.

Next to the event spool (same folder, same ``job-<id>.identity``): ``job-<id>.results.jsonl`` (one section a line,
appended before it is posted) and ``job-<id>.results.sent`` (how many of them the portal answered, replaced
atomically). An agent that restarts — killed while the portal was away — posts what was left before the results
of its new run, so nothing a stage measured is lost."""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agents.worker.spool import claim_job_files, open_for_append, sync_and_close

logger = logging.getLogger(__name__)

# post(stage, section, binding); raises ``retry_on`` while the portal is away, any other exception when it refuses.
# ``binding`` is the attempt and nonce the section was produced under ({"attempt", "nonce"}), kept with the line
# so that a section left by an earlier attempt is posted as that attempt's (and refused by the portal as stale).
PostResult = Callable[[str, dict[str, Any], dict[str, Any]], Any]


class ResultOutbox:
    """Stage sections of one job waiting to be posted, in order; retried while the portal is away."""

    def __init__(self, folder: Path, job_id: int, post: PostResult, *, retry_on: type[BaseException],
                 identity: str | None = None, binding: dict[str, Any] | None = None) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        claim_job_files(folder, job_id, identity)
        self.job_id = job_id
        self.post = post
        self.retry_on = retry_on
        self.binding = dict(binding or {})
        self.items_path = folder / f"job-{job_id}.results.jsonl"
        self.sent_path = folder / f"job-{job_id}.results.sent"
        self.refused: list[str] = []
        self._lock = threading.Lock()
        self._sent = self._read_sent()
        self._items: list[tuple[str, dict[str, Any], dict[str, Any]]] = self._read_items()[self._sent:]
        if self._items:
            logger.info("job %s: %s result(s) left by an earlier run wait to be posted", job_id, len(self._items))
        self._file = open_for_append(self.items_path)

    def _read_sent(self) -> int:
        try:
            return max(int(self.sent_path.read_text().strip() or 0), 0)
        except (FileNotFoundError, ValueError):
            return 0

    def _read_items(self) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
        items: list[tuple[str, dict[str, Any], dict[str, Any]]] = []
        if not self.items_path.exists():
            return items
        with self.items_path.open(encoding="utf-8") as fh:
            for line in fh:
                try:
                    item = json.loads(line)
                    items.append((str(item["stage"]), dict(item["section"]), dict(item.get("binding") or {})))
                except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                    logger.warning("outbox %s: skipping a torn line", self.items_path)  # a kill mid-write
        return items

    def add(self, stage: str, section: dict[str, Any]) -> None:
        with self._lock:
            line = {"stage": stage, "section": section, "binding": self.binding}
            self._file.write(json.dumps(line, default=str) + "\n")
            self._file.flush()  # in the OS page cache: survives the process being killed
            self._items.append((stage, section, self.binding))

    def _mark_sent(self) -> None:
        self._sent += 1
        tmp = self.sent_path.with_suffix(".sent.tmp")
        tmp.write_text(str(self._sent))
        os.replace(tmp, self.sent_path)

    def drain(self) -> None:
        """Posts what is waiting, oldest first; raises ``retry_on`` (the item stays) when the portal is away. A
        section the portal refuses for good is logged, kept in ``refused`` and not posted again."""
        while True:
            with self._lock:
                if not self._items:
                    return
                stage, section, binding = self._items[0]
            try:
                self.post(stage, section, binding)
            except self.retry_on:
                raise
            except Exception as exc:  # noqa: BLE001 — refused (e.g. the job was cancelled): do not retry
                logger.warning("job %s: result of %s refused: %s", self.job_id, stage, exc)
                self.refused.append(f"{stage}: {exc}")
            with self._lock:
                self._items.pop(0)
                self._mark_sent()

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def close(self, *, remove_if_sent: bool = True) -> None:
        with self._lock:
            sync_and_close(self._file)
            done = not self._items
        if remove_if_sent and done:
            self.items_path.unlink(missing_ok=True)
            self.sent_path.unlink(missing_ok=True)
