"""sha256 of every shard, computed on background threads (one per core, one shard each at a time) while
tensors stream (hashlib releases the GIL).

A digest may come from a small cache keyed by the file's identity (path, size, inode, mtime and ctime in ns):
any write to the file changes its ctime, which no user-space tool can set back, so an unchanged key means
unchanged bytes. ``DAY0_CHECKSUM_CACHE`` names the cache file ("off" disables it)."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor
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


def cache_path() -> Path | None:
    value = os.environ.get("DAY0_CHECKSUM_CACHE", "")
    if value.lower() == "off":
        return None
    return Path(value) if value else Path.home() / ".cache" / "day0" / "sha256.json"


def _identity(path: Path) -> str:
    st = path.stat()
    return f"{path.resolve()}|{st.st_size}|{st.st_ino}|{st.st_mtime_ns}|{st.st_ctime_ns}"


def _read_cache(where: Path | None) -> dict[str, str]:
    if where is None:
        return {}
    try:
        data = json.loads(where.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _write_cache(where: Path | None, entries: dict[str, str]) -> None:
    if where is None or not entries:
        return
    try:
        where.parent.mkdir(parents=True, exist_ok=True)
        merged = {**_read_cache(where), **entries}
        tmp = where.with_name(f".{where.name}.{os.getpid()}")
        tmp.write_text(json.dumps(merged))
        tmp.replace(where)
    except OSError:
        pass  # a cache that cannot be written only costs time


class ShardHasher:
    """Hashes files in order on one thread; ``result()`` joins and returns {file name: (sha256, source)} where
    source is "computed" or "cache"."""

    def __init__(self, files: list[Path], use_cache: bool = True) -> None:
        self.files = files
        self.cache_file = cache_path() if use_cache else None
        self.digests: dict[str, tuple[str, str]] = {}
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="day0-sha256", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            cache = _read_cache(self.cache_file)
            fresh: dict[str, str] = {}
            todo = []
            for path in self.files:
                key = _identity(path)
                if key in cache:
                    self.digests[path.name] = (cache[key], "cache")
                else:
                    todo.append((path, key))
            workers = max(1, min(len(todo), (os.cpu_count() or 1)))
            with ThreadPoolExecutor(workers, thread_name_prefix="day0-sha256") as pool:
                for (path, key), digest in zip(todo, pool.map(lambda t: sha256_file(t[0]), todo), strict=True):
                    if _identity(path) == key:  # unchanged while hashing
                        fresh[key] = digest
                    self.digests[path.name] = (digest, "computed")
            _write_cache(self.cache_file, fresh)
        except BaseException as exc:  # re-raised in result()
            self.error = exc

    def result(self) -> dict[str, tuple[str, str]]:
        self._thread.join()
        if self.error is not None:
            raise self.error
        return self.digests
