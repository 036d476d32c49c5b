"""One call of the shared-memory all-reduce of the ranks of one host (``csrc/shm_allreduce.c``); the segment,
the sequence numbers and the retries belong to ``agents.runtime.distributed``."""

from __future__ import annotations

import torch

from agents.runtime.kernels import library


def shm_allreduce(x: torch.Tensor, segment: int, rank: int, world: int, slot: int, seq: int, budget_s: float) -> int:
    """One call of the shared-memory all-reduce (``day0_shm_allreduce``) on contiguous fp32 CPU ``x`` of at most
    ``slot`` elements, over the segment at address ``segment``: 0 done, -1 a rank still missing after
    ``budget_s`` (call again with the same ``seq``), -2 a rank abandoned. The caller (``distributed``) owns the
    segment and the sequence; the library must be loaded."""
    return library.lib.day0_shm_allreduce(x.data_ptr(), x.numel(), segment, rank, world, slot, seq, budget_s)
