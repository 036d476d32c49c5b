"""Rank, layout and collectives for tensor, expert and pipeline parallelism.

A layout of ``world`` ranks is ``pp`` pipeline stages of ``S = world / pp`` ranks each (global rank
``stage × S + local``). Inside a stage, attention and dense MLPs shard over TP groups of ``tp`` consecutive
ranks (``S / tp`` replicas of them compute the same tokens), and routed experts partition over ``ep`` blocks of
``S / ep`` ranks, each expert split over its block: EP is independent of TP (tp=2, ep=2 on 4 ranks). TP partial
sums reduce over the TP group (``group="tp"``), expert partial sums over the whole stage (``group="stage"``);
stages hand activations on with point-to-point sends. At world size 1 every collective is a no-op, so a single
process never touches ``torch.distributed``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

if TYPE_CHECKING:
    from agents.runtime.nodes import NodeSpec

log = logging.getLogger(__name__)


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


def _collectives_active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def set_parallel_state(tp_size: int = 1, ep_size: int = 1, rank: int = 0, pp_size: int = 1) -> None:
    """Adopt a layout of the current world (each rank calls it with the same sizes). The TP and stage process
    groups it needs are made once and reused; without a process group, only the sizes are recorded."""
    global _STATE
    active = _collectives_active()
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
        _start_shm(rank, world_size, backend, timeout, node)
    set_parallel_state(tp, ep_size, rank, pp_size)


class CollectiveAbandoned(RuntimeError):
    """A peer's step failed and it abandoned the collective this rank waited in: this rank is not the cause."""


class ShmAllReduce:
    """Sums over all the ranks of a CPU world that runs on one host, through a shared-memory segment instead of
    gloo's TCP loopback (``kernels.shm_allreduce``: copy into one's slot, publish a sequence number, wait for
    every rank's, add the slots in rank order). A decode step of a 100M Llama at ``--tp 2`` on 2 cores makes 18
    collectives of 3 KB; gloo took 0.9-1.9 ms each, this 0.09-0.12. Made by ``init_distributed`` where it applies (gloo, one
    host, the native kernels loaded; ``DAY0_SHM_ALLREDUCE=0`` keeps gloo); fp32 tensors of a group that is the
    whole world take it, anything else gloo. A peer that is gone (its process ended) or that abandoned its step
    (``abandon``) ends the wait with an error instead of a hang."""

    SLOT = 1 << 18  # floats a rank publishes per call (1 MiB); larger tensors go in pieces
    POLL_S = 0.05  # the native wait returns this often so the peers' liveness is checked

    def __init__(self, rank: int, world: int, timeout: float | None) -> None:
        import ctypes
        import mmap
        import secrets

        self.rank, self.world, self.seq = rank, world, 0
        self.timeout = 300.0 if timeout is None else timeout
        size = (world + 1) * 64 + 2 * world * self.SLOT * 4
        token = [None]
        if rank == 0:  # the pages reserved now (a full /dev/shm is a fallback to gloo here, not a SIGBUS later)
            name = f"/dev/shm/day0-allreduce-{secrets.token_hex(8)}"
            try:
                fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
                try:
                    os.posix_fallocate(fd, 0, size)
                finally:
                    os.close(fd)
                token[0] = name
            except OSError as exc:
                log.warning("shared-memory all-reduce unavailable (%s): gloo sums every collective", exc)
                with contextlib.suppress(OSError):
                    os.unlink(name)
        dist.broadcast_object_list(token, src=0)
        path = token[0]
        if path is None:
            raise ShmUnavailable("rank 0 could not make the segment")
        self._map = None
        try:
            fd = os.open(path, os.O_RDWR)
            try:
                self._map = mmap.mmap(fd, size)
            finally:
                os.close(fd)
        except OSError as exc:
            log.warning("shared-memory all-reduce: rank %d cannot map %s (%s)", rank, path, exc)
        mapped: list[Any] = [None] * world
        dist.all_gather_object(mapped, self._map is not None)  # every rank or none takes it
        if rank == 0:  # every rank has it mapped: the name can go (nothing is left behind by a crash)
            with contextlib.suppress(OSError):
                os.unlink(path)
        if not all(mapped):
            if self._map is not None:
                self._map.close()
            raise ShmUnavailable("a rank could not map the segment")
        self._address = ctypes.addressof(ctypes.c_char.from_buffer(self._map))
        self._abort = ctypes.c_int64.from_address(self._address + world * 64)
        pids: list[Any] = [None] * world
        dist.all_gather_object(pids, os.getpid())
        self.peers = {r: pid for r, pid in enumerate(pids) if r != rank}

    def takes(self, x: torch.Tensor, size: int) -> bool:
        return size == self.world and x.dtype == torch.float32 and x.device.type == "cpu" and x.is_contiguous()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        from agents.runtime import kernels

        flat = x.view(-1)
        for lo in range(0, flat.numel(), self.SLOT):
            piece = flat[lo : lo + self.SLOT]
            self.seq += 1
            started = time.monotonic()
            while (rc := kernels.shm_allreduce(piece, self._address, self.rank, self.world, self.SLOT, self.seq,
                                               self.POLL_S)) == -1:
                gone = [r for r, pid in self.peers.items() if not _alive(pid)]
                if gone:
                    raise RuntimeError(f"all-reduce: rank {gone[0]} is gone (its process ended mid-step)")
                if time.monotonic() - started > self.timeout:
                    raise RuntimeError(f"all-reduce: a rank did not arrive within {self.timeout:g} s")
            if rc == -2:
                raise CollectiveAbandoned("all-reduce: another rank abandoned the step (it failed)")
        return x

    def abandon(self) -> None:
        """This rank's step failed: the peers waiting in an all-reduce stop waiting (their step fails too)."""
        self._abort.value = 1

    def close(self) -> None:
        self._abort = None
        self._map.close()


class ShmUnavailable(RuntimeError):
    """The segment could not be made or mapped on some rank: every rank sums through gloo instead."""


def _alive(pid: int) -> bool:
    """False once ``pid`` has ended (a zombie counts as ended: it runs nothing)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


_SHM: ShmAllReduce | None = None


def _start_shm(rank: int, world_size: int, backend: str, timeout: float | None, node: NodeSpec | None) -> None:
    global _SHM
    if world_size < 2 or backend != "gloo" or (node is not None and node.multi) or not os.path.isdir("/dev/shm"):
        return
    if os.environ.get("DAY0_SHM_ALLREDUCE", "1").strip().lower() in ("0", "false", "no", "off"):
        return
    from agents.runtime import kernels

    if kernels.available():  # the same answer on every rank of one host (the same library, the same CPU)
        try:
            _SHM = ShmAllReduce(rank, world_size, timeout)
        except ShmUnavailable:
            _SHM = None


def abandon_collectives() -> None:
    """A failed step on this rank: peers waiting for it in a shared-memory all-reduce stop (gloo's see the
    connection close when the process exits)."""
    if _SHM is not None:
        _SHM.abandon()


def destroy_distributed() -> None:
    global _SHM
    if _SHM is not None:
        _SHM.close()
        _SHM = None
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    _GROUP_CACHE.clear()
    set_parallel_state()


class CommTimer:
    """Time in collectives against time in steps on this rank, for the benchmark's communication overhead ratio.

    Off by default and then free (one attribute test per collective). While on (a benchmark asked), every
    collective and every step is bracketed by a device synchronisation so the host clock measures the device's
    work: that costs a host sync per collective, which is why the serving path never pays it unasked."""

    def __init__(self) -> None:
        self.enabled = False
        # rank 0 of a multi-rank server: ``peers(command)`` runs "enable", "disable" or "snapshot" on every other
        # rank and returns their snapshots by rank (``engine.tp.RankStats``), so the ratio is timed on each rank
        self.peers: Callable[[str], dict[int, dict[str, Any]]] | None = None
        self.reset()

    def reset(self) -> None:
        self.comm_seconds = 0.0
        self.step_seconds = 0.0
        self.steps = 0
        self.calls = 0
        self._depth = 0

    def enable(self, on: bool = True) -> None:
        """Start (or stop) timing from zero, on the peers too."""
        self.reset()
        self.enabled = on
        if self.peers is not None:
            self.peers("enable" if on else "disable")

    def local_snapshot(self) -> dict[str, Any]:
        ratio = self.comm_seconds / self.step_seconds if self.step_seconds > 0 else None
        return {"enabled": self.enabled, "steps": self.steps, "collectives": self.calls,
                "comm_seconds": self.comm_seconds, "step_seconds": self.step_seconds, "comm_overhead_ratio": ratio}

    def snapshot(self) -> dict[str, Any]:
        """This rank's totals; with peers, also ``ranks`` (every rank's totals, in rank order) and
        ``comm_overhead_ratio_max`` (the rank that waits longest in collectives)."""
        own = self.local_snapshot()
        if self.peers is None:
            return own
        ranks = {0: own, **self.peers("snapshot")}
        ratios = [r["comm_overhead_ratio"] for r in ranks.values() if r.get("comm_overhead_ratio") is not None]
        return {**own, "ranks": [{"rank": r, **ranks[r]} for r in sorted(ranks)],
                "comm_overhead_ratio_max": max(ratios) if ratios else None}

    @staticmethod
    def _sync(device: torch.device) -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def collective(self, x: torch.Tensor, op: Callable[[], Any]) -> Any:
        if not self.enabled:
            return op()
        self._sync(x.device)
        t0 = time.perf_counter()
        out = op()
        self._sync(x.device)
        self.comm_seconds += time.perf_counter() - t0
        self.calls += 1
        return out

    def step(self, fn: Callable) -> Callable:
        """Decorator of a runner's ``execute(self, inputs)``: one engine step on this rank (``self.device``)."""

        @functools.wraps(fn)
        def timed(runner: Any, *args: Any, **kwargs: Any) -> Any:
            if not self.enabled or self._depth:
                return fn(runner, *args, **kwargs)
            device = torch.device(runner.device)
            self._sync(device)
            self._depth += 1
            t0 = time.perf_counter()
            try:
                out = fn(runner, *args, **kwargs)
                self._sync(device)
            finally:
                self._depth -= 1
            self.step_seconds += time.perf_counter() - t0
            self.steps += 1
            return out

        return timed


COMM_TIMER = CommTimer()


def _group(kind: str) -> tuple[Any, int]:
    return _GROUPS.get(kind, (None, 1)) if _collectives_active() else (None, 1)


def all_reduce(x: torch.Tensor, group: str = "tp") -> torch.Tensor:
    """Sum ``x`` in place over this rank's ``group`` ("tp": its TP group; "stage": its pipeline stage)."""
    handle, size = _group(group)
    if size > 1:
        shm = _SHM
        if shm is not None and shm.takes(x, size):
            COMM_TIMER.collective(x, lambda: shm(x))
        else:
            COMM_TIMER.collective(x, lambda: dist.all_reduce(x, group=handle))
    return x


def all_gather(x: torch.Tensor, dim: int = -1, group: str = "tp") -> torch.Tensor:
    """Concatenate the ``group``'s ``x`` along ``dim`` in rank order (identity for a group of one)."""
    handle, size = _group(group)
    if size == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(size)]
    COMM_TIMER.collective(x, lambda: dist.all_gather(parts, x.contiguous(), group=handle))
    return torch.cat(parts, dim=dim)


def stage_peer(offset: int) -> int:
    """The global rank at the same place ``offset`` stages away (``offset`` within the pipeline)."""
    return (_STATE.pp_rank + offset) * _STATE.stage_size + _STATE.stage_rank


def send(x: torch.Tensor, dst: int) -> None:
    """Point-to-point send to global rank ``dst`` (activations between pipeline stages)."""
    COMM_TIMER.collective(x, lambda: dist.send(x.contiguous(), dst))


def broadcast(x: torch.Tensor, src: int) -> torch.Tensor:
    """``x`` from global rank ``src`` to every rank, in place (no-op at world size 1)."""
    if not x.is_contiguous():
        raise ValueError("broadcast fills its tensor in place: it must be contiguous")
    if _collectives_active():
        COMM_TIMER.collective(x, lambda: dist.broadcast(x, src))
    return x


def recv(like: torch.Tensor, src: int) -> torch.Tensor:
    """Receive a tensor shaped and typed as ``like`` from global rank ``src``."""
    out = torch.empty(like.shape, dtype=like.dtype, device=like.device)
    COMM_TIMER.collective(out, lambda: dist.recv(out, src))
    return out


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(rank: int, world_size: int, port: int, layout: tuple[int, int, int], fn: Callable, args: tuple,
            results: Any, pg_timeout: float | None = None, node: NodeSpec | None = None) -> None:
    local_world = node.local_world(world_size) if node is not None else world_size
    if node is None:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank % local_world))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
    try:
        tp_size, ep_size, pp_size = layout
        init_distributed(rank, world_size, tp_size=tp_size, ep_size=ep_size, pp_size=pp_size, timeout=pg_timeout,
                         node=node)
        out = fn(*args)
        if node is not None and node.multi:  # rank 0's node returns every node's results
            gathered = [None] * world_size if rank == 0 else None
            dist.gather_object(out, gathered, dst=0)
            if rank == 0:
                for r in range(1, world_size):
                    results[r] = ("ok", gathered[r])
        results[rank] = ("ok", out)
    except BaseException as exc:  # surfaced in the parent with the rank that failed
        import traceback

        results[rank] = ("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}", time.time())
        os._exit(1)  # no teardown: peers may be blocked in a collective; the parent ends them
    destroy_distributed()


def _wait(procs: list, timeout: float | None, grace: float = 5.0,
          watchdog: Callable[[], str | None] | None = None) -> str | None:
    """Join all ranks; once one has failed (its peers would block in a collective), the timeout has passed or
    ``watchdog()`` returns a reason, give the rest ``grace`` seconds (none for the watchdog: its ranks are stuck),
    then terminate them. Returns the watchdog's reason when it fired."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while any(p.is_alive() for p in procs):
        failed = any(p.exitcode not in (None, 0) for p in procs)
        reason = watchdog() if watchdog is not None else None
        if failed or reason or (deadline is not None and time.monotonic() > deadline):
            for p in procs:
                p.join(0 if reason else grace)
                if p.is_alive():
                    p.terminate()
                    p.join(grace)
                if p.is_alive():
                    p.kill()
                    p.join()
            return reason
        time.sleep(0.05)
    return None


def launch(fn: Callable, world_size: int, *args: Any, tp_size: int | None = None, ep_size: int = 1, pp_size: int = 1,
           timeout: float | None = None, pg_timeout: float | None = None,
           watchdog: Callable[[], str | None] | None = None, node: NodeSpec | None = None) -> list[Any]:
    """Run ``fn(*args)`` in ``world_size`` processes on this machine and return each rank's result.

    ``fn`` must be importable (module level) and its result picklable. A failure on any rank raises
    ``RuntimeError`` naming the rank and carrying its traceback; ranks left waiting on a failed peer are
    terminated, and so is every rank still running after ``timeout`` seconds. ``pg_timeout`` bounds each
    collective inside the ranks; ``watchdog`` (polled in the parent) returns a reason to kill every rank at once
    (a collective stuck past its bound), which the ``RuntimeError`` then names.

    ``node`` (ranks across hosts): ``world_size`` is the ranks of every node; this call runs only this node's
    (``node.global_ranks``), which meet the other nodes' at the master. Node 0 returns every rank's result (they
    are gathered to rank 0), another node its own ranks' results, in rank order.
    """
    tp = world_size // pp_size if tp_size is None else tp_size
    ParallelState.of(0, world_size, tp, ep_size, pp_size)  # a layout that does not fit fails here, not in a rank
    ranks = list(node.global_ranks(world_size)) if node is not None else list(range(world_size))
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        results = manager.dict()
        port = node.master_port if node is not None else free_port()
        procs = [
            ctx.Process(target=_worker, args=(r, world_size, port, (tp, ep_size, pp_size), fn, args, results,
                                                 pg_timeout, node))
            for r in ranks
        ]
        for p in procs:
            p.start()
        reason = _wait(procs, timeout, watchdog=watchdog)
        out = dict(results)
    if reason:
        raise RuntimeError(f"ranks of {world_size} ended by the watchdog: {reason}")
    if node is not None and node.multi and node.node_rank == 0 and all(out.get(r, ("",))[0] == "ok" for r in ranks):
        ranks = list(range(world_size))  # rank 0 gathered the other nodes' results
    failed = [r for r in ranks if r not in out or out[r][0] != "ok"]
    if failed:
        # the earliest failure is the cause; its peers typically fail after it ("connection closed by peer")
        r = min(failed, key=lambda k: out[k][2] if k in out else float("inf"))
        detail = out[r][1] if r in out else f"exit code {procs[ranks.index(r)].exitcode}"
        others = [k for k in failed if k != r]
        also = f" (ranks {others} failed after it)" if others else ""
        where = f" on node {node.node_rank}" if node is not None and node.multi else ""
        raise RuntimeError(f"rank {r} of {world_size}{where} failed{also}: {detail}")
    return [out[r][1] for r in ranks]
