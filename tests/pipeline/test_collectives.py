"""The collectives library (``support/collectives.py``, ``support/collective_rank.py``): collectives over real
gloo ranks, checked against a local reference, timed, and bounded.

The ranks import this module to run its fault plants, outside Django: portal imports stay inside the tests."""

from __future__ import annotations

import time

import pytest

from agents.pipeline.support.collective_rank import CommSettings, a2a_split
from agents.pipeline.support.collectives import bus_factor, measure, merge_ranks, ops_for_layout
from agents.pipeline.support.errors import StageFailed
from contract.tiers import stage_passed

SMALL = dict(dtypes=("float32",), min_bytes=256, max_bytes=4096, factor=16, iters=3, warmup=1, op_timeout_s=20.0)


def plant_wrong_sum(rank: int) -> None:
    """Rank 1's all_reduce adds one to every element after summing: a backend that reduces wrong on one rank."""
    import torch.distributed as dist

    if rank != 1:
        return
    real = dist.all_reduce

    def wrong(tensor, *args, **kwargs):  # type: ignore[no-untyped-def]
        work = real(tensor, *args, **kwargs)
        tensor.add_(1)
        return work

    dist.all_reduce = wrong


def stall_everywhere(rank: int) -> None:
    """Every rank's all_gather blocks in Python, outside the backend: its own timeout never fires."""
    import torch.distributed as dist

    def stuck(*args, **kwargs):  # type: ignore[no-untyped-def]
        time.sleep(3600)

    dist.all_gather_into_tensor = stuck
    dist.all_gather_single = stuck  # torch 2.13's name for it


def stall_rank_one(rank: int) -> None:
    """Rank 1 never joins the all_to_all: rank 0 waits in gloo until the group's timeout."""
    import torch.distributed as dist

    if rank == 1:
        dist.all_to_all_single = lambda *args, **kwargs: time.sleep(3600)


def test_bus_factors_are_those_of_nccl_tests() -> None:
    assert bus_factor("all_reduce", 4) == pytest.approx(1.5)
    assert bus_factor("all_gather", 4) == bus_factor("reduce_scatter", 4) == bus_factor("all_to_all", 4) == 0.75
    assert bus_factor("broadcast", 8) == bus_factor("send_recv", 8) == 1.0


def test_all_to_all_splits_are_uneven_and_sum_to_the_buffer() -> None:
    for n in (2, 3, 4, 8):
        for src in range(n):
            splits = [a2a_split(src, dst, 1000, n) for dst in range(n)]
            assert sum(splits) == 1000
            assert len(set(splits)) > 1


def test_layouts_name_the_collectives_they_run() -> None:
    assert ops_for_layout(1, 1, 1) == ()
    assert set(ops_for_layout(2, 1, 1)) == {"all_reduce", "all_gather", "reduce_scatter", "broadcast"}
    assert "all_to_all" in ops_for_layout(1, 1, 4) and "send_recv" not in ops_for_layout(1, 1, 4)
    assert "send_recv" in ops_for_layout(1, 2, 1)


def test_settings_reject_bad_bounds_naming_them() -> None:
    with pytest.raises(ValueError, match="unknown collective"):
        CommSettings(ops=("all_reduce", "gossip"), dtypes=("float32",))
    with pytest.raises(ValueError, match="max_bytes"):
        CommSettings(ops=("all_reduce",), dtypes=("float32",), min_bytes=4096, max_bytes=1024)
    with pytest.raises(ValueError, match="comm_timeout_s"):
        CommSettings(ops=("all_reduce",), dtypes=("float32",), op_timeout_s=0)
    assert CommSettings(ops=(), dtypes=(), min_bytes=1024, max_bytes=65536, factor=4).sizes() == [1024, 4096, 16384,
                                                                                                   65536]


def test_merge_takes_the_slowest_rank_per_iteration() -> None:
    point = {"bytes": 1_000_000, "mismatch": None}
    per_rank = [[{"op": "all_reduce", "dtype": "float32", "sizes": [{**point, "seconds": [1e-3, 2e-3]}]}],
                [{"op": "all_reduce", "dtype": "float32", "sizes": [{**point, "seconds": [3e-3, 1e-3]}]}]]
    (row,) = merge_ranks(per_rank, 2)
    (size,) = row["sizes"]
    assert row["ok"] and size["latency_us"]["max"] == pytest.approx(3000)
    assert size["algbw_gbps"] == pytest.approx(1e6 / 2.5e-3 / 1e9)  # mean of the per-step maxima (3 ms, 2 ms)
    assert size["busbw_gbps"] == pytest.approx(size["algbw_gbps"] * 1.0)  # 2(n-1)/n at n=2


def test_conformance_catches_a_planted_wrong_reduction() -> None:
    settings = CommSettings(ops=("all_reduce", "all_to_all"), **SMALL)
    section = measure(2, settings, rank_setup=plant_wrong_sum)
    rows = {row["op"]: row for row in section["collectives"]}
    assert rows["all_to_all"]["ok"] is True
    assert rows["all_reduce"]["ok"] is False
    assert rows["all_reduce"]["mismatches"][0].startswith("rank 1 at ")
    assert "all_reduce float32" in section["error"]
    assert stage_passed("comm", section) is False


def test_a_collective_stuck_on_every_rank_is_ended_by_the_watchdog_naming_it() -> None:
    settings = CommSettings(ops=("all_gather",), **{**SMALL, "op_timeout_s": 1.0}, watchdog_grace_s=1.0)
    t0 = time.monotonic()
    with pytest.raises(StageFailed, match=r"all_gather float32 at 256 B did not finish within 2 s on rank"):
        measure(2, settings, rank_setup=stall_everywhere)
    assert time.monotonic() - t0 < 60


@pytest.mark.slow
def test_a_rank_missing_from_a_collective_times_out_on_its_peer_naming_it() -> None:
    settings = CommSettings(ops=("all_to_all",), **{**SMALL, "op_timeout_s": 2.0})
    with pytest.raises(StageFailed, match=r"all_to_all float32 at 256 B failed on rank 0"):
        measure(2, settings, rank_setup=stall_rank_one)
