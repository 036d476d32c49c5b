"""Building the kernels' shared library: once per (sources, compiler, flags, CPU) into a cache, or ahead of time.

``cached_build`` compiles ``csrc/day0_kernels.c`` (one translation unit that includes every op family's file) with
the system C compiler into ``$DAY0_KERNEL_CACHE`` (default ``~/.cache/day0/kernels``) under a name keyed by all of
that, and prunes libraries of other keys unused for ``PRUNE_DAYS``. ``build_prebuilt`` (``python -m
agents.runtime.kernels build [--out DIR]``) writes the library once as ``day0_cpu_kernels.so`` in a folder a
serving host reads it from (``prebuilt_path``) with no compiler of its own; the library carries the digest of the
sources it came from, and the loader uses it only when that digest, its ABI and this CPU match."""

from __future__ import annotations

import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

CSRC = Path(__file__).with_name("csrc")
SOURCE = CSRC / "day0_kernels.c"  # the build unit: it includes the other files of CSRC
FLAGS = ["-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-std=c11", "-fno-math-errno"]
PRUNE_DAYS = 30  # libraries of other sources unused this long are removed when a new one is built
PREBUILT_NAME = "day0_cpu_kernels.so"
PREBUILT_ENV = "DAY0_KERNEL_PREBUILT"  # the folder of a prebuilt library (default: the cache folder)


def cache_dir() -> Path:
    return Path(os.environ.get("DAY0_KERNEL_CACHE") or Path.home() / ".cache" / "day0" / "kernels")


def prebuilt_dir() -> Path:
    return Path(os.environ.get(PREBUILT_ENV) or cache_dir())


def prebuilt_path() -> Path:
    return prebuilt_dir() / PREBUILT_NAME


def compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _sources() -> list[Path]:
    """The build unit and every file it may include (a standalone SOURCE outside CSRC is its own unit)."""
    if SOURCE.parent != CSRC:
        return [SOURCE]
    return sorted(p for p in CSRC.iterdir() if p.suffix in (".c", ".h"))


def source_digest() -> str:
    """sha256 of the sources' names and text: what a library records and the loader compares."""
    h = hashlib.sha256()
    for path in _sources():
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def _cpu_key() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _flags() -> list[str]:
    return [*FLAGS, *shlex.split(os.environ.get("DAY0_KERNEL_CFLAGS", ""))]


def _compile(cc: str, target: Path, digest: str) -> None:
    """Compile into ``target`` through a temporary file in its folder (atomic: a concurrent build of the same key
    writes the same bytes; a failed one leaves nothing behind)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        done = subprocess.run([cc, *_flags(), f'-DDAY0_SOURCE_DIGEST="{digest}"', "-o", tmp, str(SOURCE), "-lm"],
                              capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"{Path(cc).name} failed (exit {done.returncode}): {done.stderr.strip()[-800:]}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def cached_build(cc: str) -> Path:
    """The cached library for these sources, compiler, flags and CPU, compiled when it is not there yet."""
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    digest = source_digest()
    key = hashlib.sha256("\0".join([digest, cc, version, " ".join(_flags()), _cpu_key()]).encode())
    target = cache_dir() / f"day0_cpu_kernels-{key.hexdigest()[:16]}.so"
    if target.exists():
        _touch(target)
        return target
    _compile(cc, target, digest)
    _prune(target)
    return target


def build_prebuilt(out: Path | None = None) -> Path:
    """Write the library once as ``out/day0_cpu_kernels.so`` (default: ``prebuilt_dir()``) for hosts without a
    compiler; ``DAY0_KERNEL_CFLAGS`` picks the target CPU (``-march=x86-64-v3`` for any AVX2 host, say: the default
    is this host's). RuntimeError when no compiler is found or the build fails."""
    cc = compiler()
    if cc is None:
        raise RuntimeError("no C compiler (cc, gcc or clang) on PATH")
    target = (out or prebuilt_dir()) / PREBUILT_NAME
    _compile(cc, target, source_digest())
    return target


def _touch(path: Path) -> None:
    """A library's mtime is its last use (the cache may be read-only: then it is left as it is)."""
    try:
        os.utime(path)
    except OSError:
        pass


def _prune(keep: Path) -> None:
    """Each edit of the source, compiler or CPU leaves a library behind: those unused for PRUNE_DAYS go when a
    new one is built (one still loaded by a running process stays mapped; it is only unlinked)."""
    horizon = time.time() - PRUNE_DAYS * 86400
    for old in keep.parent.glob("day0_cpu_kernels-*.so"):
        try:
            if old != keep and old.stat().st_mtime < horizon:
                old.unlink()
        except OSError:
            pass
