"""Collectives by group (``group="tp"``: this rank's TP group; ``"stage"``: its pipeline stage) and the
stage-to-stage sends, each timed by ``COMM_TIMER``; at world size 1 they are no-ops."""

from __future__ import annotations

import torch
import torch.distributed as dist

from agents.runtime.distributed import layout, shm_allreduce
from agents.runtime.distributed.comm_timer import COMM_TIMER


def all_reduce(x: torch.Tensor, group: str = "tp") -> torch.Tensor:
    """Sum ``x`` in place over this rank's ``group`` ("tp": its TP group; "stage": its pipeline stage)."""
    handle, size = layout.group(group)
    if size > 1:
        shm = shm_allreduce.active()
        if shm is not None and shm.takes(x, size):
            COMM_TIMER.collective(x, lambda: shm(x))
        else:
            COMM_TIMER.collective(x, lambda: dist.all_reduce(x, group=handle))
    return x


def all_gather(x: torch.Tensor, dim: int = -1, group: str = "tp") -> torch.Tensor:
    """Concatenate the ``group``'s ``x`` along ``dim`` in rank order (identity for a group of one)."""
    handle, size = layout.group(group)
    if size == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(size)]
    COMM_TIMER.collective(x, lambda: dist.all_gather(parts, x.contiguous(), group=handle))
    return torch.cat(parts, dim=dim)


def send(x: torch.Tensor, dst: int) -> None:
    """Point-to-point send to global rank ``dst`` (activations between pipeline stages)."""
    COMM_TIMER.collective(x, lambda: dist.send(x.contiguous(), dst))


def broadcast(x: torch.Tensor, src: int) -> torch.Tensor:
    """``x`` from global rank ``src`` to every rank, in place (no-op at world size 1)."""
    if not x.is_contiguous():
        raise ValueError("broadcast fills its tensor in place: it must be contiguous")
    if layout.collectives_active():
        COMM_TIMER.collective(x, lambda: dist.broadcast(x, src))
    return x


def recv(like: torch.Tensor, src: int) -> torch.Tensor:
    """Receive a tensor shaped and typed as ``like`` from global rank ``src``."""
    out = torch.empty(like.shape, dtype=like.dtype, device=like.device)
    COMM_TIMER.collective(out, lambda: dist.recv(out, src))
    return out
