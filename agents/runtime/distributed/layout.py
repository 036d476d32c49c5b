"""This rank's place in the TP × PP × EP layout (``ParallelState``) and the process groups of that layout, made once
and reused (see the package docstring for the layout)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.distributed as dist


@dataclass(frozen=True)
class ParallelState:
    """This rank's place in the layout; ``stage_size`` ranks per pipeline stage (see the module docstring)."""

    tp_rank: int = 0
    tp_size: int = 1
    ep_rank: int = 0
    ep_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1
    stage_rank: int = 0
    stage_size: int = 1

    def __post_init__(self) -> None:
        for name, rank, size in (("tp", self.tp_rank, self.tp_size), ("ep", self.ep_rank, self.ep_size),
                                 ("pp", self.pp_rank, self.pp_size), ("stage", self.stage_rank, self.stage_size)):
            if size < 1 or not 0 <= rank < size:
                raise ValueError(f"{name} rank {rank} is outside world size {size}")

    @classmethod
    def of(cls, rank: int, world: int, tp: int, ep: int = 1, pp: int = 1) -> ParallelState:
        """The layout of global ``rank``; ValueError naming the degree that does not fit ``world``."""
        if pp < 1 or world % pp:
            raise ValueError(f"pp={pp} must divide the world size {world}")
        stage = world // pp
        for name, size in (("tp", tp), ("ep", ep)):
            if size < 1 or stage % size:
                raise ValueError(f"{name}={size} must divide the {stage} ranks of a pipeline stage "
                                 f"(world {world} / pp {pp})")
        local = rank % stage
        return cls(local % tp, tp, local // (stage // ep), ep, rank // stage, pp, local, stage)

    @property
    def expert_tp_size(self) -> int:
        """Ranks each routed expert is split over (its intermediate dimension)."""
        return self.stage_size // self.ep_size

    @property
    def expert_tp_rank(self) -> int:
        return self.stage_rank % self.expert_tp_size

    @property
    def attention_replica(self) -> int:
        """Which of the stage's ``S / tp`` identical TP groups this rank is in."""
        return self.stage_rank // self.tp_size

    def group_ranks(self, kind: str) -> list[list[int]]:
        """Every group of ``kind`` ("tp" or "stage") over the world, as global ranks."""
        s, tp = self.stage_size, self.tp_size
        if kind == "tp":
            return [[p * s + j * tp + i for i in range(tp)] for p in range(self.pp_size) for j in range(s // tp)]
        if kind == "stage":
            return [[p * s + i for i in range(s)] for p in range(self.pp_size)]
        raise ValueError(f"unknown group kind {kind!r}")


_STATE = ParallelState()
_GROUPS: dict[str, Any] = {}  # kind -> this rank's process group (None: the default group)
_GROUP_CACHE: dict[tuple[int, ...], Any] = {}


def get_parallel_state() -> ParallelState:
    return _STATE


def get_tp_rank() -> int:
    return _STATE.tp_rank


def get_tp_world_size() -> int:
    return _STATE.tp_size


def get_ep_rank() -> int:
    return _STATE.ep_rank


def get_ep_world_size() -> int:
    return _STATE.ep_size


def get_pp_rank() -> int:
    return _STATE.pp_rank


def get_pp_world_size() -> int:
    return _STATE.pp_size


def collectives_active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def set_parallel_state(tp_size: int = 1, ep_size: int = 1, rank: int = 0, pp_size: int = 1) -> None:
    """Adopt a layout of the current world (each rank calls it with the same sizes). The TP and stage process
    groups it needs are made once and reused; without a process group, only the sizes are recorded."""
    global _STATE
    active = collectives_active()
    world = dist.get_world_size() if active else max(tp_size, ep_size) * pp_size
    _STATE = ParallelState.of(rank, world, tp_size, ep_size, pp_size)
    _GROUPS.clear()
    for kind in ("tp", "stage"):
        for ranks in _STATE.group_ranks(kind):
            if not active or len(ranks) == 1 or len(ranks) == world:
                group = None
            else:  # every rank makes every group, in the same order
                key = tuple(ranks)
                if key not in _GROUP_CACHE:
                    _GROUP_CACHE[key] = dist.new_group(ranks)
                group = _GROUP_CACHE[key]
            if rank in ranks:
                _GROUPS[kind] = (group, len(ranks))


def group(kind: str) -> tuple[Any, int]:
    """(this rank's process group of ``kind``, its size); (None, 1) while no collective runs."""
    return _GROUPS.get(kind, (None, 1)) if collectives_active() else (None, 1)


def stage_peer(offset: int) -> int:
    """The global rank at the same place ``offset`` stages away (``offset`` within the pipeline)."""
    return (_STATE.pp_rank + offset) * _STATE.stage_size + _STATE.stage_rank


def forget_groups() -> None:
    """The process groups made so far are gone with their process group (``destroy_distributed``)."""
    _GROUP_CACHE.clear()
