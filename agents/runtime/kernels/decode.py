"""A decode step through a run of whole decoder layers in one native call (``models/native_decode.py`` plans the
runs and fills the ``DecodeLayer`` array)."""

from __future__ import annotations

import ctypes

import torch

from agents.runtime.kernels import library
from agents.runtime.kernels.scratch import thread_buffer


def decode_scratch(layers: ctypes.Array, hidden: int, batch: int) -> int:
    """Floats of scratch ``decode_layers`` needs for ``layers`` at ``batch`` rows (the C side's own count); -1
    when the kernel does not take the layers."""
    return library.lib.day0_decode_scratch(ctypes.addressof(layers), len(layers), hidden, batch)


def decode_layers(x: torch.Tensor, delta: torch.Tensor, has_delta: bool, normed: torch.Tensor, layers: ctypes.Array,
                  cos: torch.Tensor, sin: torch.Tensor, slots: torch.Tensor, tables: torch.Tensor,
                  seqlens: torch.Tensor, block_size: int) -> bool:
    """A decode step through ``layers`` (a ``DecodeLayer`` array: every layer but the last with its MLP) in one
    call. ``x [B, hidden]`` (the residual stream, updated in place), ``delta [B, hidden]`` (the previous MLP's
    output still to add when ``has_delta``; this run's last MLP output on return), ``normed [B, hidden]`` (the last
    layer's post-attention norm when it has no MLP here). The caller checked the tensors (contiguous fp32 CPU,
    rotary tables ``[B, 1, 2, rot/2]``, int64 ``slots [B]``, int32 ``tables [B, width]`` and ``seqlens [B]``).
    False when the kernel does not take the shapes (nothing written then)."""
    floats = decode_scratch(layers, x.shape[1], x.shape[0])
    if floats < 0:
        return False
    scratch = thread_buffer("decode_layers", floats, torch.float32)
    rc = library.lib.day0_decode_layers(
        x.data_ptr(), delta.data_ptr(), int(has_delta), normed.data_ptr(), ctypes.addressof(layers), len(layers),
        x.shape[0], x.shape[1], cos.data_ptr(), sin.data_ptr(), slots.data_ptr(), tables.data_ptr(), seqlens.data_ptr(),
        block_size, tables.shape[1], scratch.data_ptr())
    return rc == 0
