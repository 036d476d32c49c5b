"""Dense linears over panel-packed weights: ``pack_panels`` lays a weight out once, ``panel_linear`` streams it."""

from __future__ import annotations

import torch

from agents.runtime.kernels import library
from agents.runtime.kernels.scratch import thread_buffer

PANEL = 16  # outputs per weight panel (``pack_panels``)


def pack_panels(w: torch.Tensor) -> torch.Tensor | None:
    """A 2-D fp32 weight ``[N, K]`` (rows contiguous) as panels ``[ceil(N / 16), K, 16]``: ``wp[p, k, c] =
    w[16 p + c, k]``, the rows past N zero; the layout ``panel_linear`` streams. None when not covered."""
    if not library.ok(w) or w.dim() != 2 or w.stride(1) != 1 or w.shape[0] == 0:
        return None
    n, k = w.shape
    wp = torch.empty((-(-n // PANEL), k, PANEL), dtype=torch.float32)
    library.lib.day0_pack_panels(wp.data_ptr(), w.data_ptr(), n, k, w.stride(0))
    return wp


def pack_panels_into(wp: torch.Tensor, w: torch.Tensor) -> bool:
    """``pack_panels`` into an existing contiguous ``wp [ceil(N / 16), K, 16]`` (a view into a larger buffer, such
    as one expert's panels): rows of ``w [N, K]`` contiguous, any row stride. False when not covered."""
    if (not library.ok(wp, w) or w.dim() != 2 or w.stride(1) != 1 or w.shape[0] == 0 or wp.dim() != 3
            or not wp.is_contiguous() or tuple(wp.shape) != (-(-w.shape[0] // PANEL), w.shape[1], PANEL)):
        return False
    library.lib.day0_pack_panels(wp.data_ptr(), w.data_ptr(), w.shape[0], w.shape[1], w.stride(0))
    return True


def panel_linear(x: torch.Tensor, wp: torch.Tensor, n: int, bias: torch.Tensor | None = None) -> torch.Tensor | None:
    """``x W^T (+ bias)`` for ``x [M, K]`` (rows contiguous) and ``W [n, K]`` packed by ``pack_panels`` ->
    ``[M, n]``; every output one multiply-add chain over k in order, the same whatever M or the thread count.
    None when not covered."""
    extra = () if bias is None else (bias,)
    if not library.ok(x, wp, *extra) or x.dim() != 2 or x.stride(1) != 1 or wp.dim() != 3 or (
            wp.shape[1:] != (x.shape[1], PANEL) or not wp.is_contiguous() or n < 1 or -(-n // PANEL) != wp.shape[0]):
        return None  # n must need exactly these panels: the last one holds 1..16 of the outputs
    if bias is not None and (bias.shape != (n,) or not bias.is_contiguous()):
        return None
    m, k = x.shape
    y = torch.empty((m, n), dtype=torch.float32)
    xp = thread_buffer("buf", (m + PANEL - 1) * k).data_ptr() if m > 1 else 0  # tiles of <= 16 rows; one row in place
    library.lib.day0_panel_linear(y.data_ptr(), x.data_ptr(), wp.data_ptr(), 0 if bias is None else bias.data_ptr(),
                                  m, n, k, x.stride(0), n, xp)
    return y
