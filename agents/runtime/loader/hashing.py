"""sha256 of every shard, computed on background threads while tensors stream: one thread per core this process
may run on, each hashing a different shard (largest first, so the cores finish together), reading ahead of the
hash so that a cold file's I/O overlaps it; hashlib and file reads release the GIL. A load that verifies every
shard is then bound by the hash (~1 GB/s per core), not by the loader.

A digest may come from a small cache keyed by the file's identity (path, size, inode, mtime and ctime in ns):
any write to the file changes its ctime, which no user-space tool can set back, so an unchanged key means
unchanged bytes. ``DAY0_CHECKSUM_CACHE`` names the cache file ("off" disables it)."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

CHUNK = 8 * 1024 * 1024


def sha256_file(path: Path) -> str:
    """The file's sha256, read in ``CHUNK`` pieces into one reused buffer (resident memory stays one chunk); the
    kernel is asked for the next chunk before the current one is hashed."""
    digest = hashlib.sha256()
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        fd, offset = f.fileno(), 0
        advise = getattr(os, "posix_fadvise", None)
        if advise is not None:
            advise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        while n := f.readinto(buf):
            offset += n
            if advise is not None:
                advise(fd, offset, CHUNK, os.POSIX_FADV_WILLNEED)  # read-ahead while this chunk is hashed
            digest.update(view[:n])
    return digest.hexdigest()


def hash_workers() -> int:
    """Threads that hash: the cores this process may run on (its affinity, not the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


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
    """Hashes ``files`` in the background from construction on (``workers`` threads, default one per core, a
    shard each; digests of unchanged files from the cache); ``result()`` joins and returns {file name: (sha256,
    source)} where source is "computed" or "cache". ``seconds``: how long the hashing took."""

    def __init__(self, files: list[Path], use_cache: bool = True, workers: int | None = None) -> None:
        self.files = files
        self.cache_file = cache_path() if use_cache else None
        self.digests: dict[str, tuple[str, str]] = {}
        self.error: BaseException | None = None
        self.workers = workers or hash_workers()
        self.seconds = 0.0
        self.computed_bytes = 0
        self._thread = threading.Thread(target=self._run, name="day0-sha256", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        t0 = time.perf_counter()
        try:
            cache = _read_cache(self.cache_file)
            fresh: dict[str, str] = {}
            todo = []
            for path in self.files:
                key = _identity(path)
                if key in cache:
                    self.digests[path.name] = (cache[key], "cache")
                else:
                    todo.append((path, key, path.stat().st_size))
            todo.sort(key=lambda t: -t[2])  # longest first: no core is left with a big shard at the end
            self.computed_bytes = sum(t[2] for t in todo)
            if todo:
                with ThreadPoolExecutor(min(len(todo), self.workers), thread_name_prefix="day0-sha256") as pool:
                    for (path, key, _), digest in zip(todo, pool.map(lambda t: sha256_file(t[0]), todo), strict=True):
                        if _identity(path) == key:  # unchanged while hashing
                            fresh[key] = digest
                        self.digests[path.name] = (digest, "computed")
            _write_cache(self.cache_file, fresh)
        except BaseException as exc:  # re-raised in result()
            self.error = exc
        finally:
            self.seconds = time.perf_counter() - t0

    def result(self) -> dict[str, tuple[str, str]]:
        self._thread.join()
        if self.error is not None:
            raise self.error
        return self.digests
