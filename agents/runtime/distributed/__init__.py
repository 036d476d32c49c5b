"""Rank, layout and collectives for tensor, expert and pipeline parallelism.

A layout of ``world`` ranks is ``pp`` pipeline stages of ``S = world / pp`` ranks each (global rank
``stage × S + local``). Inside a stage, attention and dense MLPs shard over TP groups of ``tp`` consecutive
ranks (``S / tp`` replicas of them compute the same tokens), and routed experts partition over ``ep`` blocks of
``S / ep`` ranks, each expert split over its block: EP is independent of TP (tp=2, ep=2 on 4 ranks). TP partial
sums reduce over the TP group (``group="tp"``), expert partial sums over the whole stage (``group="stage"``);
stages hand activations on with point-to-point sends. At world size 1 every collective is a no-op, so a single
process never touches ``torch.distributed``.
"""

from agents.runtime.distributed.collectives import all_gather, all_reduce, broadcast, recv, send
from agents.runtime.distributed.comm_timer import COMM_TIMER, CommTimer
from agents.runtime.distributed.launcher import free_port, launch
from agents.runtime.distributed.layout import (
    ParallelState,
    get_ep_rank,
    get_ep_world_size,
    get_parallel_state,
    get_pp_rank,
    get_pp_world_size,
    get_tp_rank,
    get_tp_world_size,
    set_parallel_state,
    stage_peer,
)
from agents.runtime.distributed.process_group import abandon_collectives, destroy_distributed, init_distributed
from agents.runtime.distributed.shm_allreduce import CollectiveAbandoned, ShmAllReduce, ShmUnavailable

__all__ = [
    "COMM_TIMER", "CollectiveAbandoned", "CommTimer", "ParallelState", "ShmAllReduce", "ShmUnavailable",
    "abandon_collectives", "all_gather", "all_reduce", "broadcast", "destroy_distributed", "free_port",
    "get_ep_rank", "get_ep_world_size", "get_parallel_state", "get_pp_rank", "get_pp_world_size", "get_tp_rank",
    "get_tp_world_size", "init_distributed", "launch", "recv", "send", "set_parallel_state", "stage_peer",
]
