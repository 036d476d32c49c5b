"""Joining and leaving the process group of the ranks (gloo on CPU, NCCL on CUDA), the shared-memory all-reduce
with it where it applies."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from agents.runtime.distributed import shm_allreduce
from agents.runtime.distributed.layout import ParallelState, forget_groups, set_parallel_state

if TYPE_CHECKING:
    from agents.runtime.nodes import NodeSpec


def init_distributed(
    rank: int = 0,
    world_size: int = 1,
    *,
    tp_size: int | None = None,
    ep_size: int = 1,
    pp_size: int = 1,
    init_method: str | None = None,
    backend: str | None = None,
    timeout: float | None = None,
    node: NodeSpec | None = None,
) -> None:
    """Join the process group (gloo on CPU, NCCL on CUDA) and adopt the TP × PP × EP layout.

    ``tp_size`` defaults to the ranks of a stage (``world_size / pp_size``); tp and ep must divide them.
    ``timeout`` (seconds) bounds every collective of the group: one that does not finish raises on its rank.
    ``node`` (ranks across hosts): meet at its master address and port through a bounded rendezvous that names a
    node that never came (``agents.runtime.nodes``) instead of ``init_method``.
    """
    tp = world_size // max(pp_size, 1) if tp_size is None else tp_size
    ParallelState.of(rank, world_size, tp, ep_size, pp_size)  # a bad layout fails before any rendezvous
    local_world = node.local_world(world_size) if node is not None else world_size
    if world_size > 1 and not dist.is_initialized():
        backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        if backend == "nccl":  # this node's devices, by local rank
            torch.cuda.set_device(rank % local_world % torch.cuda.device_count())
        if node is not None:
            from agents.runtime.nodes import init_node_group

            init_node_group(rank, world_size, node, backend, timeout)
        else:
            bound = {} if timeout is None else {"timeout": timedelta(seconds=timeout)}
            dist.init_process_group(backend, init_method=init_method or "env://", rank=rank, world_size=world_size,
                                    **bound)
        shm_allreduce.start(rank, world_size, backend, timeout, node)
    set_parallel_state(tp, ep_size, rank, pp_size)


def abandon_collectives() -> None:
    """A failed step on this rank: peers waiting for it in a shared-memory all-reduce stop (gloo's see the
    connection close when the process exits)."""
    shm_allreduce.abandon()


def destroy_distributed() -> None:
    shm_allreduce.stop()
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    forget_groups()
    set_parallel_state()
