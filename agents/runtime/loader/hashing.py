"""sha256 of every shard, computed on a background thread while tensors stream (hashlib releases the GIL)."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

CHUNK = 8 * 1024 * 1024


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            digest.update(view[:n])
    return digest.hexdigest()


class ShardHasher:
    """Hashes files in order on one thread; ``result()`` joins and returns {file name: sha256}."""

    def __init__(self, files: list[Path]) -> None:
        self.files = files
        self.digests: dict[str, str] = {}
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="day0-sha256", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for path in self.files:
                self.digests[path.name] = sha256_file(path)
        except BaseException as exc:  # re-raised in result()
            self.error = exc

    def result(self) -> dict[str, str]:
        self._thread.join()
        if self.error is not None:
            raise self.error
        return self.digests
