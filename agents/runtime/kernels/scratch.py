"""Per-thread scratch buffers of the kernel wrappers, grown and never shrunk: a fresh 30+ MB buffer per prefill
layer was mmapped and faulted in on every call. Each calling thread has its own (the server calls from one)."""

from __future__ import annotations

import threading

import torch

_buffers = threading.local()


def thread_buffer(name: str, elements: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The calling thread's buffer ``name`` of at least ``elements`` (grown, never shrunk)."""
    buf = getattr(_buffers, name, None)
    if buf is None or buf.numel() < elements:
        buf = torch.empty(max(elements, 1 << 16), dtype=dtype)
        setattr(_buffers, name, buf)
    return buf
