"""The communication overhead timer: time in collectives over step time, on each rank, only while asked."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from agents.runtime.distributed import COMM_TIMER, CommTimer, all_gather, all_reduce, launch


class _Runner:
    device = "cpu"

    @COMM_TIMER.step
    def execute(self, x: torch.Tensor) -> torch.Tensor:
        y = x @ x  # compute the collective does not cover
        return all_gather(all_reduce(y), dim=0)


def _steps() -> dict[str, Any]:
    runner, x = _Runner(), torch.randn(64, 64)
    runner.execute(x)
    untimed = COMM_TIMER.snapshot()
    COMM_TIMER.enable()
    for _ in range(3):
        runner.execute(x)
    timed = COMM_TIMER.snapshot()
    COMM_TIMER.enable(False)
    return {"untimed": untimed, "timed": timed}


@pytest.mark.slow
def test_each_rank_times_its_collectives_within_its_steps() -> None:
    for rank in launch(_steps, 2, timeout=120):
        assert rank["untimed"]["steps"] == 0 and rank["untimed"]["comm_seconds"] == 0.0  # off: nothing counted
        timed = rank["timed"]
        assert timed["steps"] == 3 and timed["collectives"] == 6
        assert 0 < timed["comm_seconds"] < timed["step_seconds"]
        assert 0 < timed["comm_overhead_ratio"] < 1


def test_a_nested_step_is_counted_once_and_one_process_has_no_collectives() -> None:
    timer = CommTimer()

    class Runner:
        device = "cpu"

        @timer.step
        def outer(self) -> None:
            self.inner()

        @timer.step
        def inner(self) -> None:
            all_reduce(torch.ones(4))  # world size 1: a no-op, never timed

    timer.enable()
    Runner().outer()
    assert timer.snapshot()["steps"] == 1 and timer.snapshot()["collectives"] == 0
    assert timer.snapshot()["comm_overhead_ratio"] == 0.0
