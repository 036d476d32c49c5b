"""Pinning the calling thread's OpenMP team one thread to a CPU (``csrc/threads.c``); ``agents/runtime/threads.py``
decides which CPUs."""

from __future__ import annotations

import torch

from agents.runtime.kernels import library


def bind_threads(cpus: list[int]) -> bool:
    """Pin the calling thread's OpenMP team (``len(cpus)`` threads, the caller first) one thread to a CPU, for
    every later parallel region of this thread, torch's included; True when every thread was pinned. False when
    the library is not loaded (nothing is pinned then)."""
    if not cpus or not library.available():
        return False
    ids = torch.tensor(cpus, dtype=torch.int32)
    return library.lib.day0_bind_threads(ids.data_ptr(), len(cpus)) == len(cpus)


def one_thread_here() -> bool:
    """Run the calling thread's later OpenMP regions (the kernels' and torch's) on that thread alone (OpenMP's
    per-thread ``omp_set_num_threads``): for worker threads that already run one per core, such as the loader's,
    whose teams would only spin at their barriers on each other's cores. False when the library is not loaded."""
    if not library.available():
        return False
    try:
        set_threads = library.lib.omp_set_num_threads  # the OpenMP runtime the library (and torch) share
    except AttributeError:
        return False
    set_threads(1)
    return True
