"""One call of the shared-memory all-reduce of the ranks of one host (``csrc/shm_allreduce.c``); the segment
and its ``DecodeComm`` belong to ``agents.runtime.distributed``."""

from __future__ import annotations

import ctypes

import torch

from agents.runtime.kernels import library
from agents.runtime.kernels.abi import DecodeComm


def shm_allreduce(x: torch.Tensor, comm: DecodeComm) -> int:
    """The shared-memory all-reduce (``day0_shm_allreduce``) of contiguous fp32 CPU ``x`` in place, in pieces of
    ``comm.slot`` elements, each on the next sequence number (``comm.seq`` advanced), waiting as a native decode run
    waits (the peers' processes checked every ``comm.poll_s``, at most ``comm.timeout_s`` a piece): 0 done, else
    ``COMM_ABANDONED``, ``COMM_GONE`` (``comm.failed``) or ``COMM_TIMEOUT``. The library must be loaded."""
    return library.lib.day0_shm_allreduce(x.data_ptr(), x.numel(), ctypes.byref(comm))
