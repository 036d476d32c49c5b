"""The memory allocator of a serving process on a CPU host (``day0 serve --allocator``).

A decode step allocates and frees the same few hundred tensors every step (activations, logits, attention
outputs). glibc's malloc hands the large ones back to the kernel on free and takes fresh zeroed pages on the
next step: on the 100M Llama 16 sequences at once that was ~750k page faults per benchmark run, against ~155k
with tcmalloc, which keeps freed memory for reuse (vLLM's CPU docs recommend preloading it for the same reason).
``auto`` (the default) re-executes the server once with tcmalloc in ``LD_PRELOAD`` when the library is on the
host (Debian: ``libtcmalloc-minimal4``), and asks torch for transparent huge pages for its large tensors
(``THP_MEM_ALLOC_ENABLE=1``: the weights are streamed every step, and 2 MiB pages spare the TLB). A preload
can only happen before the process starts, hence the re-exec; it happens at most once (``DAY0_ALLOCATOR_SET``)
and never when the CLI was called in-process with its own argument list."""

from __future__ import annotations

import ctypes.util
import logging
import os
import sys
from pathlib import Path

log = logging.getLogger(__name__)

CHOICES = ("auto", "tcmalloc", "system")
TCMALLOC_NAMES = ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4")
LIB_DIRS = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu",
            "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib")
MARK = "DAY0_ALLOCATOR_SET"


def find_tcmalloc() -> str | None:
    """The path of tcmalloc on this host, or None."""
    for name in TCMALLOC_NAMES:
        for d in LIB_DIRS:
            if (Path(d) / name).is_file():
                return str(Path(d) / name)
    found = ctypes.util.find_library("tcmalloc_minimal") or ctypes.util.find_library("tcmalloc")
    return found if found and Path(found).is_absolute() else None


def preloaded(env: dict[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return "tcmalloc" in env.get("LD_PRELOAD", "")


def plan(choice: str, env: dict[str, str] | None = None) -> tuple[dict[str, str] | None, str]:
    """(the environment to re-execute with, or None to go on as is; what was decided, in words)."""
    env = dict(os.environ if env is None else env)
    if choice not in CHOICES:
        raise ValueError(f"--allocator must be one of {', '.join(CHOICES)}, got {choice!r}")
    if choice == "system":
        return None, "system malloc (--allocator system)"
    if preloaded(env):
        return None, "tcmalloc (preloaded)"
    if env.get(MARK):
        return None, "system malloc (tcmalloc was asked for but did not load)"
    lib = find_tcmalloc()
    if lib is None:
        if choice == "tcmalloc":
            raise ValueError("--allocator tcmalloc: no tcmalloc on this host (Debian: apt-get install "
                             "libtcmalloc-minimal4)")
        return None, "system malloc (no tcmalloc on this host; Debian: libtcmalloc-minimal4)"
    env["LD_PRELOAD"] = ":".join(p for p in (lib, env.get("LD_PRELOAD", "")) if p)
    env.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    env[MARK] = "1"
    return env, f"tcmalloc ({lib})"


def reexec_with(env: dict[str, str]) -> None:
    """Replace this process by the same command under ``env`` (returns only if the exec fails)."""
    argv = list(getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv])
    try:
        os.execve(sys.executable, argv, env)
    except OSError as exc:
        log.warning("could not re-execute with tcmalloc (%s); going on with the system malloc", exc)
