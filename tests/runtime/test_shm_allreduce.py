"""The shared-memory all-reduce of CPU ranks on one host (``distributed.shm_allreduce``): the sum in rank order,
the same bits on every rank, tensors larger than a slot in pieces, gloo for what it does not take, and an error
instead of a hang when a peer is gone or abandoned its step."""

from __future__ import annotations

import hashlib
import time

import pytest
import torch
import torch.distributed as dist

from agents.runtime import distributed, kernels
from agents.runtime.distributed import ShmAllReduce, launch, shm_allreduce

pytestmark = pytest.mark.skipif(not kernels.available(), reason="native kernels not built here")

SIZES = [1, 768, 16 * 768, ShmAllReduce.SLOT + 5]  # the last goes in two pieces (1 MiB slots)


def _part(rank: int, n: int) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(1000 * n + rank))


def sums() -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    shm = shm_allreduce.active()
    out = []
    for n in SIZES:
        expected = _part(0, n).clone()
        for r in range(1, world):  # rank order, as every rank adds the slots
            expected += _part(r, n)
        got = distributed.all_reduce(_part(rank, n), group="tp")
        out.append((torch.equal(got, expected), hashlib.sha256(got.numpy().tobytes()).hexdigest()))
    half = distributed.all_reduce(torch.full((4,), float(rank + 1), dtype=torch.bfloat16), group="tp")  # gloo
    return {"shm": shm is not None, "seq": shm.seq if shm else 0, "sums": out, "bf16": half.float().tolist()}


def test_the_ranks_of_one_host_sum_through_shared_memory_in_rank_order():
    per_rank = launch(sums, 2, timeout=120)
    for result in per_rank:
        assert result["shm"] is True
        assert result["seq"] == len(SIZES) + 1  # one call each, the largest in two pieces; bf16 went to gloo
        assert all(equal for equal, _ in result["sums"])
        assert result["bf16"] == [3.0] * 4
    assert [d for _, d in per_rank[0]["sums"]] == [d for _, d in per_rank[1]["sums"]]  # the same bits


@pytest.mark.slow
def test_three_ranks_and_gloo_when_it_is_turned_off(monkeypatch):
    assert all(r["shm"] and all(eq for eq, _ in r["sums"]) for r in launch(sums, 3, timeout=120))
    monkeypatch.setenv("DAY0_SHM_ALLREDUCE", "0")
    per_rank = launch(sums, 2, timeout=120)
    assert [r["shm"] for r in per_rank] == [False, False]
    assert all(all(eq for eq, _ in r["sums"]) for r in per_rank)  # gloo: the same sums (two terms: one order)


def peer_leaves() -> str:
    if dist.get_rank() == 1:
        time.sleep(0.5)
        return "left"  # its process ends without joining the all-reduce
    start = time.monotonic()
    try:
        distributed.all_reduce(torch.ones(8), group="tp")
    except RuntimeError as exc:
        return f"{exc} after {time.monotonic() - start:.1f} s"
    return "no error"


def peer_abandons() -> str:
    if dist.get_rank() == 1:
        distributed.abandon_collectives()  # as a rank whose step failed does before it exits
        dist.barrier()
        return "abandoned"
    dist.barrier()
    try:
        distributed.all_reduce(torch.ones(8), group="tp")
    except distributed.CollectiveAbandoned as exc:
        return str(exc)
    return "no error"


@pytest.mark.slow
def test_a_peer_that_is_gone_or_abandoned_ends_the_wait_with_an_error():
    left = launch(peer_leaves, 2, timeout=60)[0]
    assert left.startswith("all-reduce: rank 1 is gone"), left
    assert float(left.split(" after ")[1].split()[0]) < 10
    assert launch(peer_abandons, 2, timeout=60)[0] == "all-reduce: another rank abandoned the step (it failed)"


def shm_fails(where: str) -> dict:
    """The segment made again under a fault: ``reserve`` (rank 0's posix_fallocate fails, as on a full /dev/shm)
    or ``map`` (rank 1 cannot map it). Every rank must fall back to gloo together, the segment's name must not
    be left in /dev/shm, and the sums must still be right."""
    import contextlib
    import errno
    import glob
    import mmap
    import os
    from unittest import mock

    rank, world = dist.get_rank(), dist.get_world_size()
    shm_allreduce.stop()
    before = set(glob.glob("/dev/shm/day0-allreduce-*"))

    def no_space(*_a):
        raise OSError(errno.ENOSPC, "No space left on device")

    fault = {("reserve", 0): (os, "posix_fallocate"), ("map", 1): (mmap, "mmap")}.get((where, rank))
    with mock.patch.object(*fault, no_space) if fault else contextlib.nullcontext():
        shm_allreduce.start(rank, world, "gloo", 30.0, None)
    dist.barrier()
    left = sorted(set(glob.glob("/dev/shm/day0-allreduce-*")) - before)
    expected = _part(0, 768) + _part(1, 768)
    got = distributed.all_reduce(_part(rank, 768), group="tp")
    return {"shm": shm_allreduce.active() is not None, "left": left, "sum": torch.equal(got, expected)}


@pytest.mark.slow
@pytest.mark.parametrize("where", ["reserve", "map"])
def test_a_segment_that_cannot_be_made_or_mapped_falls_back_to_gloo_on_every_rank(where):
    per_rank = launch(shm_fails, 2, where, timeout=120)
    assert [r["shm"] for r in per_rank] == [False, False]
    assert all(r["left"] == [] for r in per_rank)  # nothing left behind in /dev/shm
    assert all(r["sum"] for r in per_rank)
