"""The routed SwiGLU experts of a MoE layer in one call: from the checkpoint layout (``moe_experts``) or over
panel-packed weights (``pack_expert_panels``, ``moe_panels``). None when a case is not covered."""

from __future__ import annotations

import torch

from agents.runtime.kernels import library
from agents.runtime.kernels.panels import PANEL
from agents.runtime.kernels.scratch import thread_buffer


def moe_experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, ids: torch.Tensor,
                weights: torch.Tensor) -> torch.Tensor | None:
    """Routed SwiGLU experts with every expert local and whole: ``x [T, H]``, ``w13 [E, 2I, H]`` (gate rows, then
    up rows), ``w2 [E, H, I]``, routing ``ids [T, k]`` and ``weights [T, k]`` -> ``[T, H]``, each token's expert
    terms added in ascending expert order (as the grouped path adds them); None when not covered."""
    if x.dim() != 2 or w13.dim() != 3 or w2.dim() != 3 or ids.dim() != 2 or ids.shape != weights.shape:
        return None
    t, h = x.shape
    e, two_i, h13 = w13.shape
    inter = two_i // 2
    if (h13 != h or two_i % 2 or tuple(w2.shape) != (e, h, inter) or ids.shape[0] != t or ids.dtype is not torch.int64
            or not library.ok(x, w13, w2, weights) or not ids.is_cpu
            or not all(z.is_contiguous() for z in (x, w13, w2, ids, weights))):
        return None
    pairs = ids.numel()
    out = torch.empty(t, h)
    scratch = torch.empty(pairs * (inter + h))
    work = torch.empty(2 * e + 1 + 2 * pairs, dtype=torch.int64)
    rc = library.lib.day0_moe_experts(out.data_ptr(), x.data_ptr(), w13.data_ptr(), w2.data_ptr(), ids.data_ptr(),
                                      weights.data_ptr(), t, ids.shape[1], e, h, inter, scratch.data_ptr(),
                                      work.data_ptr())
    return out if rc == 0 else None


def expert_panel_shapes(e: int, inter: int, h: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The shapes ``pack_expert_panels`` gives ``e`` experts of intermediate size ``inter`` and hidden size ``h``:
    ``[E, 2 ceil(I/16), H, 16]`` and ``[E, ceil(H/16), I, 16]``."""
    return (e, 2 * -(-inter // PANEL), h, PANEL), (e, -(-h // PANEL), inter, PANEL)


def pack_expert_panels(w13: torch.Tensor, w2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Stacked SwiGLU experts ``w13 [E, 2I, H]`` (gate rows, then up rows) and ``w2 [E, H, I]`` as the panels
    ``moe_panels`` streams: ``[E, 2 ceil(I/16), H, 16]`` (each expert's gate panels, then its up panels, each
    half padded with zero rows) and ``[E, ceil(H/16), I, 16]``. None when not covered."""
    if not library.ok(w13, w2) or w13.dim() != 3 or w2.dim() != 3 or not (w13.is_contiguous() and w2.is_contiguous()):
        return None
    e, two_i, h = w13.shape
    inter = two_i // 2
    if two_i % 2 or inter == 0 or h == 0 or tuple(w2.shape) != (e, h, inter):
        return None
    gp = -(-inter // PANEL)
    w13_shape, w2_shape = expert_panel_shapes(e, inter, h)
    w13p = torch.empty(w13_shape, dtype=torch.float32)
    w2p = torch.empty(w2_shape, dtype=torch.float32)
    for i in range(e):
        library.lib.day0_pack_panels(w13p[i, :gp].data_ptr(), w13[i, :inter].data_ptr(), inter, h, h)
        library.lib.day0_pack_panels(w13p[i, gp:].data_ptr(), w13[i, inter:].data_ptr(), inter, h, h)
        library.lib.day0_pack_panels(w2p[i].data_ptr(), w2[i].data_ptr(), h, inter, inter)
    return w13p, w2p


def unpack_expert_panels(w13p: torch.Tensor, w2p: torch.Tensor, inter: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The stacked ``(w13 [E, 2I, H], w2 [E, H, I])`` back from ``pack_expert_panels``' panels, in torch ops (new
    tensors): for the code paths that read the plain layout (a tracer, other dtypes)."""
    e, two_gp, h, _ = w13p.shape
    gp = two_gp // 2
    rows = w13p.reshape(e, 2, gp, h, PANEL).permute(0, 1, 2, 4, 3).reshape(e, 2, gp * PANEL, h)[:, :, :inter]
    down = w2p.permute(0, 1, 3, 2).reshape(e, -1, inter)[:, :h]
    return rows.reshape(e, 2 * inter, h), down.contiguous()


def moe_panels(x: torch.Tensor, w13p: torch.Tensor, w2p: torch.Tensor, inter: int, ids: torch.Tensor,
               weights: torch.Tensor) -> torch.Tensor | None:
    """``moe_experts`` over the panels of ``pack_expert_panels`` (``inter`` = I): ``x [T, H]``, routing ``ids
    [T, k]`` and ``weights [T, k]`` -> ``[T, H]``, each token's expert terms added in ascending expert order and
    every product one multiply-add chain over k (a token's result is the same whatever it is batched with); any
    number of rows per expert. None when not covered."""
    if x.dim() != 2 or w13p.dim() != 4 or w2p.dim() != 4 or ids.dim() != 2 or ids.shape != weights.shape:
        return None
    t, h = x.shape
    e, two_gp, h13, lanes = w13p.shape
    gp, hp = -(-inter // PANEL), -(-h // PANEL)
    if (inter < 1 or h13 != h or lanes != PANEL or two_gp != 2 * gp or tuple(w2p.shape) != (e, hp, inter, PANEL)
            or ids.shape[0] != t or ids.dtype is not torch.int64 or not library.ok(x, w13p, w2p, weights)
            or not ids.is_cpu
            or not all(z.is_contiguous() for z in (x, w13p, w2p, ids, weights))):
        return None
    pairs = ids.numel()
    rows = pairs + (PANEL - 1) * e  # each expert's rows padded to whole tiles
    out = torch.empty(t, h)
    # kept per thread: a fresh 30+ MB buffer per prefill layer was mmapped and faulted in on every call
    scratch = thread_buffer("moe", rows * (h + inter) + pairs * h, torch.float32)
    work = thread_buffer("moe_work", 10 * e + 9 * pairs + 3, torch.int64)
    rc = library.lib.day0_moe_panels(out.data_ptr(), x.data_ptr(), w13p.data_ptr(), w2p.data_ptr(), ids.data_ptr(),
                                     weights.data_ptr(), t, ids.shape[1], e, h, inter, scratch.data_ptr(),
                                     work.data_ptr())
    return out if rc == 0 else None
