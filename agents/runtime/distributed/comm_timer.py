"""The collective timer behind the benchmark's communication overhead ratio (``COMM_TIMER``)."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import torch


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
