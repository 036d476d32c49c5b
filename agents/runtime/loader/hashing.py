"""sha256 of every shard, computed on background threads while tensors stream: one thread per core this process
may run on, each hashing a different shard (largest first, handed out as threads free up, so the cores finish
together). Each shard is hashed straight from a read-only mapping in ``CHUNK`` pieces (no copy into a buffer
first: ~20 % faster than ``read()``), the next piece asked for before the current one is hashed (a cold file's
I/O overlaps the hash) and each hashed piece unmapped at once, so a thread keeps one piece mapped. hashlib
releases the GIL while it hashes. A load that verifies every shard is then bound by the hash (~1 GB/s per core),
not by the loader.

(Child processes instead of threads were measured and lost: starting an interpreter and OpenSSL took ~40 ms of
each core, more than the GIL waits they saved on a 0.4 GB checkpoint.)

A digest may come from a small cache keyed by the file's identity (path, size, inode, mtime and ctime in ns):
any write to the file changes its ctime, which no user-space tool can set back, so an unchanged key means
unchanged bytes. ``DAY0_CHECKSUM_CACHE`` names the cache file ("off" disables it)."""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

CHUNK = 8 * 1024 * 1024


def sha256_file(path: Path) -> str:
    """The file's sha256, hashed straight from a read-only mapping in ``CHUNK`` pieces: no copy into a buffer
    (``read()`` would move every byte once more; hashing the mapped pages runs ~20 % faster), the next piece
    asked for before the current one is hashed (a cold file's I/O overlaps the hash), and each hashed piece
    unmapped at once, so the file adds at most one piece to the resident memory. A file that cannot be mapped
    (empty, or a pipe or special file) is read instead."""
    digest = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        try:
            mm = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) if size else None
        except (OSError, ValueError):
            mm = None
        if mm is None:
            return _sha256_read(f, digest)
        with mm:
            mm.madvise(mmap.MADV_SEQUENTIAL)
            view = memoryview(mm)
            try:
                for offset in range(0, size, CHUNK):
                    n = min(CHUNK, size - offset)
                    if offset + n < size:
                        mm.madvise(mmap.MADV_WILLNEED, offset + n, min(CHUNK, size - offset - n))
                    digest.update(view[offset:offset + n])
                    mm.madvise(mmap.MADV_DONTNEED, offset, n)  # only the mapping goes: the page cache keeps them
            finally:
                view.release()
    return digest.hexdigest()


def _sha256_read(f, digest) -> str:
    """The rest of ``f`` hashed through one reused buffer (a file that cannot be mapped)."""
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    while n := f.readinto(buf):
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
    shard each; digests of unchanged files from the cache, looked up before construction returns, so
    ``computed_bytes`` already says how much is left to hash); ``result()`` joins and returns {file name: (sha256,
    source)} where source is "computed" or "cache". ``seconds``: how long the hashing took."""

    def __init__(self, files: list[Path], use_cache: bool = True, workers: int | None = None) -> None:
        self.files = files
        self.cache_file = cache_path() if use_cache else None
        self.digests: dict[str, tuple[str, str]] = {}
        self.error: BaseException | None = None
        self.workers = workers or hash_workers()
        self.seconds = 0.0
        self._t0 = time.perf_counter()
        cache = _read_cache(self.cache_file)
        self._todo = []
        for path in self.files:
            key = _identity(path)
            if key in cache:
                self.digests[path.name] = (cache[key], "cache")
            else:
                self._todo.append((path, key, path.stat().st_size))
        self._todo.sort(key=lambda t: -t[2])  # longest first: no core is left with a big shard at the end
        self.computed_bytes = sum(t[2] for t in self._todo)
        self._thread = threading.Thread(target=self._run, name="day0-sha256", daemon=True)
        self._thread.start()

    @property
    def busy(self) -> bool:
        """Still hashing: the cores are taken by the hash threads."""
        return self._thread.is_alive()

    def _run(self) -> None:
        try:
            fresh: dict[str, str] = {}
            if self._todo:
                paths = [t[0] for t in self._todo]
                with ThreadPoolExecutor(min(len(paths), self.workers), thread_name_prefix="day0-sha256") as pool:
                    digests = dict(zip(paths, pool.map(sha256_file, paths), strict=True))
                for path, key, _ in self._todo:
                    if _identity(path) == key:  # unchanged while hashing
                        fresh[key] = digests[path]
                    self.digests[path.name] = (digests[path], "computed")
            _write_cache(self.cache_file, fresh)
        except BaseException as exc:  # re-raised in result()
            self.error = exc
        finally:
            self.seconds = time.perf_counter() - self._t0

    def result(self) -> dict[str, tuple[str, str]]:
        self._thread.join()
        if self.error is not None:
            raise self.error
        return self.digests


def shard_rows(files: list[Path], hasher: ShardHasher) -> list[dict]:
    """The load report's ``shards`` of a release read outside the safetensors path (GGUF, integer formats): one
    row per file with its digest, where the digest came from, and its size."""
    digests = hasher.result()
    rows = []
    for path in files:
        digest, source = digests.get(path.name, (None, None))
        size = path.stat().st_size
        rows.append({"file": path.name, "sha256": digest, "sha256_source": source, "size": size, "bytes": size})
    return rows
