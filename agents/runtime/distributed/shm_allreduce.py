"""The shared-memory all-reduce of the CPU ranks of one host: the segment every rank maps, the sequence numbers, the
error instead of a hang (the sum, the wait and the peers' liveness checks are the native ``day0_shm_allreduce``'s,
the same as a native decode run makes inside)."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from agents.runtime import kernels
from agents.runtime.distributed.comm_timer import COMM_TIMER
from agents.runtime.kernels.shm_allreduce import shm_allreduce

if TYPE_CHECKING:
    from agents.runtime.nodes import NodeSpec

log = logging.getLogger(__name__)


class CollectiveAbandoned(RuntimeError):
    """A peer's step failed and it abandoned the collective this rank waited in: this rank is not the cause."""


class ShmAllReduce:
    """Sums over all the ranks of a CPU world that runs on one host, through a shared-memory segment instead of
    gloo's TCP loopback (``kernels.shm_allreduce``: copy into one's slot, publish a sequence number, wait for
    every rank's, add the slots in rank order). A decode step of a 100M Llama at ``--tp 2`` on 2 cores makes 18
    collectives of 3 KB; gloo took 0.9-1.9 ms each, this 0.09-0.12. Made by ``init_distributed`` (``start``) where
    it applies (gloo, one host, the native kernels loaded; ``DAY0_SHM_ALLREDUCE=0`` keeps gloo); fp32 tensors of a
    group that is the whole world take it, anything else gloo. A peer that is gone (its process ended) or that abandoned its step
    (``abandon``) ends the wait with an error instead of a hang. A native decode run of a TP rank sums through
    the same segment inside its call (``native_comm``, ``native_done``), on the same sequence numbers."""

    SLOT = 1 << 18  # floats a rank publishes per call (1 MiB); larger tensors go in pieces
    POLL_S = 0.05  # how often the native wait checks the peers' processes

    def __init__(self, rank: int, world: int, timeout: float | None) -> None:
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
        self._pids = (ctypes.c_int64 * world)(*pids)  # what the native wait checks while it waits (native_comm)
        self._comm: kernels.DecodeComm | None = None

    def takes(self, x: torch.Tensor, size: int) -> bool:
        return size == self.world and x.dtype == torch.float32 and x.device.type == "cpu" and x.is_contiguous()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` (``takes``) over the ranks in place, in pieces of ``SLOT`` floats; a peer gone, late past the
        timeout or abandoned raises (``native_done``). The wait is the native run's own (``kernels.shm_allreduce``)."""
        comm = self.native_comm()
        self.native_done(comm, shm_allreduce(x, comm), timed=False)  # COMM_TIMER times this call (collectives)
        return x

    def native_comm(self) -> kernels.DecodeComm:
        """The segment as the native wait sees it, for ``__call__`` and for a native run's collectives inside
        (``kernels.decode_layers``): one wait, one set of slots, pieces and sequence numbers, so a rank may take
        either path on any step. Starts from this object's sequence number; hand it back with ``native_done``."""
        comm = self._comm
        if comm is None:
            comm = self._comm = kernels.DecodeComm(
                seg=self._address, pids=ctypes.addressof(self._pids), rank=self.rank, world=self.world, slot=self.SLOT,
                poll_s=self.POLL_S, timeout_s=self.timeout)
        comm.seq, comm.failed, comm.calls, comm.wait_s = self.seq, -1, 0, 0.0
        return comm

    def native_done(self, comm: kernels.DecodeComm, rc: int, timed: bool = True) -> None:
        """Take back the sequence number a native run advanced, count its collectives and their time on
        ``COMM_TIMER`` (``timed``), and raise for a failed one (``rc``, ``kernels.COMM_*``)."""
        self.seq = comm.seq
        if timed and COMM_TIMER.enabled:  # the native run times its waits itself (the CPU has no device to synchronise)
            COMM_TIMER.comm_seconds += comm.wait_s
            COMM_TIMER.calls += comm.calls
        if rc == kernels.COMM_ABANDONED:
            raise CollectiveAbandoned("all-reduce: another rank abandoned the step (it failed)")
        if rc == kernels.COMM_GONE:
            raise RuntimeError(f"all-reduce: rank {comm.failed} is gone (its process ended mid-step)")
        if rc == kernels.COMM_TIMEOUT:
            raise RuntimeError(f"all-reduce: a rank did not arrive within {self.timeout:g} s")

    def abandon(self) -> None:
        """This rank's step failed: the peers waiting in an all-reduce stop waiting (their step fails too)."""
        self._abort.value = 1

    def close(self) -> None:
        self._abort = None
        self._map.close()


class ShmUnavailable(RuntimeError):
    """The segment could not be made or mapped on some rank: every rank sums through gloo instead."""


_ACTIVE: ShmAllReduce | None = None  # this process's segment, while its world takes it


def start(rank: int, world_size: int, backend: str, timeout: float | None, node: NodeSpec | None) -> None:
    """Make the segment where it applies (gloo, one host, the native kernels loaded, not turned off); every rank
    of the world calls it, and every rank or none takes it."""
    global _ACTIVE
    if world_size < 2 or backend != "gloo" or (node is not None and node.multi) or not os.path.isdir("/dev/shm"):
        return
    if os.environ.get("DAY0_SHM_ALLREDUCE", "1").strip().lower() in ("0", "false", "no", "off"):
        return
    if kernels.available():  # the same answer on every rank of one host (the same library, the same CPU)
        try:
            _ACTIVE = ShmAllReduce(rank, world_size, timeout)
        except ShmUnavailable:
            _ACTIVE = None


def active() -> ShmAllReduce | None:
    return _ACTIVE


def abandon() -> None:
    """A failed step on this rank: peers waiting for it in the all-reduce stop waiting."""
    if _ACTIVE is not None:
        _ACTIVE.abandon()


def stop() -> None:
    global _ACTIVE
    if _ACTIVE is not None:
        _ACTIVE.close()
        _ACTIVE = None
