"""A decode step through a run of whole decoder layers in one native call (``models/native_decode.py`` plans the
runs and fills the ``DecodeLayer`` array; on a tensor-parallel rank ``distributed.ShmAllReduce.native_comm`` fills
the ``DecodeComm`` of the all-reduce the call makes inside)."""

from __future__ import annotations

import ctypes

import torch

from agents.runtime.kernels import library
from agents.runtime.kernels.abi import DECODE_REFUSED, DecodeComm
from agents.runtime.kernels.scratch import thread_buffer


def decode_scratch(layers: ctypes.Array, hidden: int, batch: int) -> int:
    """Floats of scratch ``decode_layers`` needs for ``layers`` at ``batch`` rows (the C side's own count); -1
    when the kernel does not take the layers."""
    return library.lib.day0_decode_scratch(ctypes.addressof(layers), len(layers), hidden, batch)


def decode_layers(x: torch.Tensor, delta: torch.Tensor, has_delta: bool, normed: torch.Tensor, layers: ctypes.Array,
                  cos: torch.Tensor, sin: torch.Tensor, slots: torch.Tensor, tables: torch.Tensor,
                  seqlens: torch.Tensor, block_size: int, comm: DecodeComm | None = None) -> int:
    """A decode step through ``layers`` (a ``DecodeLayer`` array: every layer but the last with its MLP) in one
    call. ``x [B, hidden]`` (the residual stream, updated in place), ``delta [B, hidden]`` (the previous MLP's
    output still to add when ``has_delta``; this run's last MLP output on return), ``normed [B, hidden]`` (the last
    layer's post-attention norm when it has no MLP here). The caller checked the tensors (contiguous fp32 CPU,
    rotary tables ``[B, 1, 2, rot/2]``, int64 ``slots [B]``, int32 ``tables [B, width]`` and ``seqlens [B]``).
    ``comm``: None on one rank; on a tensor-parallel rank the shared-memory all-reduce of the O and down
    projections' partial sums, made inside the call (its ``seq`` advanced). Returns ``DECODE_DONE`` (0),
    ``DECODE_REFUSED`` when the kernel does not take the shapes (nothing written then), or a collective's failure
    mid-run (``COMM_ABANDONED``, ``COMM_GONE`` with ``comm.failed``, ``COMM_TIMEOUT``)."""
    floats = decode_scratch(layers, x.shape[1], x.shape[0])
    if floats < 0:
        return DECODE_REFUSED
    scratch = thread_buffer("decode_layers", floats, torch.float32)
    return library.lib.day0_decode_layers(
        x.data_ptr(), delta.data_ptr(), int(has_delta), normed.data_ptr(), ctypes.addressof(layers), len(layers),
        x.shape[0], x.shape[1], cos.data_ptr(), sin.data_ptr(), slots.data_ptr(), tables.data_ptr(), seqlens.data_ptr(),
        block_size, tables.shape[1], scratch.data_ptr(), None if comm is None else ctypes.byref(comm))
