"""Loading the kernels' library once per process: a prebuilt one where it matches, else the compiler cache.

``available()`` loads on first call: a prebuilt ``day0_cpu_kernels.so`` (``build.prebuilt_path()``) is used when its
ABI, struct sizes and source digest match this tree and this CPU runs its instructions; otherwise (none there, or
refused: said once in the log) the system C compiler builds into the cache (``build.cached_build``). Where neither
works (no compiler, another OS or CPU architecture, a failing build) or the kernels are turned off
(``DAY0_NATIVE_KERNELS=0``), it is False and every layer runs its torch code. ctypes releases the GIL for each call.
The wrappers read ``lib`` and call ``ok`` before each call."""

from __future__ import annotations

import ctypes
import logging
import os
import platform
import threading
from pathlib import Path

import torch

from agents.runtime.kernels import abi, build

log = logging.getLogger(__name__)

lib: ctypes.CDLL | None = None
path: Path | None = None  # the loaded library's file
state = "unloaded"  # unloaded | loaded | unavailable
reason = ""
lanes = 0  # floats per vector of the loaded build
key_chunk = 0  # keys per chunk of the prefill attention (its transposed keys are kept in chunks of this many)

_lock = threading.Lock()
_dispatch_modes = torch._C._len_torch_dispatch_stack  # > 0 while a TorchDispatchMode is active (0.1 us a call)


def _open(candidate: Path, digest: str | None) -> ctypes.CDLL:
    """``candidate`` loaded and bound; RuntimeError naming what differs when its ABI or struct sizes (or, for a
    prebuilt library, its sources or instruction sets) are not this tree's."""
    handle = ctypes.CDLL(str(candidate))
    differs = abi.mismatch(handle)
    if differs is None and digest is not None:
        built_from = handle.day0_source_digest().decode()
        if built_from != digest:
            differs = f"it was built from other sources (digest {built_from[:12]}, these {digest[:12]})"
        elif not handle.day0_cpu_supported():
            differs = "it was built for instructions this CPU lacks"
    if differs:
        raise RuntimeError(f"{candidate} refused: {differs}")
    abi.bind(handle)
    return handle


def _prebuilt() -> tuple[ctypes.CDLL | None, Path | None, str]:
    """(the prebuilt library, its path, '') when one is there and matches; (None, None, why not) otherwise."""
    candidate = build.prebuilt_path()
    if not candidate.is_file():
        return None, None, ""
    try:
        return _open(candidate, build.source_digest()), candidate, ""
    except Exception as exc:
        return None, None, str(exc) if isinstance(exc, RuntimeError) else f"{candidate}: {type(exc).__name__}: {exc}"


def _load() -> None:
    global key_chunk, lanes, lib, path, reason, state
    if os.environ.get("DAY0_NATIVE_KERNELS", "1").strip().lower() in ("0", "false", "no", "off"):
        state, reason = "unavailable", "turned off by DAY0_NATIVE_KERNELS"
        return
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64", "aarch64"):
        state, reason = "unavailable", f"not built for {platform.system()} {platform.machine()}"
        return
    torch.get_num_threads()  # torch (and its OpenMP runtime, which the library then shares) is loaded
    handle, where, refused = _prebuilt()
    if refused:
        log.warning("prebuilt native CPU kernels not used (%s)", refused)
    if handle is None:
        cc = build.compiler()
        if cc is None:
            state, reason = "unavailable", "no C compiler (cc, gcc or clang) on PATH" + (
                f"; {refused}" if refused else "")
            return
        try:
            where = build.cached_build(cc)
            handle = _open(where, None)
        except Exception as exc:  # any failure leaves the torch code in charge, said once
            state, reason = "unavailable", f"{type(exc).__name__}: {exc}"
            log.warning("native CPU kernels unavailable (%s); the layers run their torch code", reason)
            return
    lib, path, state, reason = handle, where, "loaded", ""
    lanes, key_chunk = handle.day0_vector_width(), handle.day0_prefill_key_chunk()
    log.info("native CPU kernels loaded from %s", where)


def available() -> bool:
    """True when the library is built and loaded (building it on first call)."""
    if state == "unloaded":
        with _lock:
            if state == "unloaded":
                _load()
    return state == "loaded"


def status() -> dict[str, object]:
    """loaded, the reason it is not, and the vector lanes of the build (None when not loaded)."""
    available()
    return {"loaded": state == "loaded", "reason": reason or None,
            "vector_width": lib.day0_vector_width() if state == "loaded" else None}


def ok(*tensors: torch.Tensor) -> bool:
    """The library is loaded, nothing traces the ops (torch.compile fuses these ops itself and cannot trace a
    ctypes call; a dispatch mode, such as the pipeline's operator inventory, must see the model's own aten ops)
    and every tensor is an fp32 CPU tensor (cheap checks: this runs per layer call)."""
    if state != "loaded" and not available() or torch.compiler.is_compiling() or _dispatch_modes():
        return False
    f32 = torch.float32
    return all(t.is_cpu and t.dtype is f32 for t in tensors)
