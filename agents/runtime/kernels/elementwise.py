"""Row kernels: RMSNorm, residual add + RMSNorm, SiLU-and-mul, in-place RoPE, the greedy argmax. Each wrapper says
None/False for a case it does not cover (dtype, device, layout), and the caller runs its torch code."""

from __future__ import annotations

import torch

from agents.runtime.kernels import library


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor | None:
    """``x * rsqrt(mean(x^2, -1) + eps) * weight`` as a new contiguous tensor, for x of 2 or 3 dims whose last
    dim is contiguous (a view of heads inside a row is fine); None when not covered."""
    if not library.ok(x, weight) or x.stride(-1) != 1:
        return None
    if x.dim() == 2:
        outer, inner, so, si = x.shape[0], 1, x.stride(0), 0
    elif x.dim() == 3:
        outer, inner, so, si = x.shape[0], x.shape[1], x.stride(0), x.stride(1)
    else:
        return None
    out = torch.empty(x.shape, dtype=torch.float32)
    library.lib.day0_rms_norm(out.data_ptr(), x.data_ptr(), weight.data_ptr(), outer, inner, x.shape[-1], so, si, eps)
    return out


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(h = x + delta, rms_norm(h) * weight), both new [T, N] tensors; None when not covered."""
    if not library.ok(x, delta, weight) or x.dim() != 2 or x.shape != delta.shape or not (x.is_contiguous() and
                                                                                 delta.is_contiguous()):
        return None
    h, normed = torch.empty_like(x), torch.empty_like(x)
    library.lib.day0_add_rms_norm(h.data_ptr(), normed.data_ptr(), x.data_ptr(), delta.data_ptr(), weight.data_ptr(),
                                  x.shape[0], x.shape[1], eps)
    return h, normed


def silu_and_mul(x: torch.Tensor) -> torch.Tensor | None:
    """``silu(x[:, :I]) * x[:, I:]`` for a contiguous [T, 2I] x; None when not covered."""
    if not library.ok(x) or x.dim() != 2 or not x.is_contiguous() or x.shape[1] % 2:
        return None
    rows, inter = x.shape[0], x.shape[1] // 2
    out = torch.empty(rows, inter)
    library.lib.day0_silu_and_mul(out.data_ptr(), x.data_ptr(), rows, inter)
    return out


def rotary_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rot: int) -> bool:
    """Rotate-half RoPE of ``x [T, heads, D]`` in place (heads contiguous in a row; rows strided), with the
    rotary tables as ``RotaryEmbedding.cos_sin`` returns them ([T, 1, 2, rot/2], contiguous); False when not
    covered."""
    if not library.ok(x, cos, sin) or x.dim() != 3 or x.stride(2) != 1 or x.stride(1) != x.shape[2] or rot % 2 or (
            rot > x.shape[2] or cos.numel() != x.shape[0] * rot or sin.numel() != cos.numel()):
        return False
    library.lib.day0_rotary(x.data_ptr(), cos.data_ptr(), sin.data_ptr(), x.shape[0], x.shape[1], x.shape[2],
                            x.stride(0), rot)
    return True


def argmax_rows(x: torch.Tensor) -> list[int] | None:
    """``x.argmax(-1).tolist()`` for contiguous fp32 ``[N, V]`` logits (the first maximum of each row); None when
    not covered, or when a row holds a NaN (torch's argmax then decides)."""
    if not library.ok(x) or x.dim() != 2 or not x.is_contiguous() or x.shape[1] == 0:
        return None
    out = torch.empty(x.shape[0], dtype=torch.int64)
    library.lib.day0_argmax_rows(out.data_ptr(), x.data_ptr(), x.shape[0], x.shape[1])
    picks = out.tolist()
    return None if -1 in picks else picks
