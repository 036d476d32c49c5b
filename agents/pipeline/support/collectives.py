"""A collectives library: the collectives of a TP × PP × EP layout over ranks (gloo processes on CPU, NCCL on
CUDA) for a list of dtypes — conformance against a reference each rank computes locally, bandwidth as nccl-tests
defines it over a message-size sweep, and per-iteration latency percentiles (one rank's work:
``support.collective_rank``).

Sizes follow nccl-tests: ``bytes`` is the whole buffer of the operation (all_reduce and broadcast: the buffer;
all_gather: the gathered output; reduce_scatter: the input every rank reduces; all_to_all: each rank's send
buffer; send_recv: the message). ``algbw = bytes / time`` (mean of the iterations) and ``busbw = algbw × factor``
with the factor of each op (``bus_factor``), so busbw is comparable with the link's bandwidth at any rank count.

A collective that does not finish within ``op_timeout_s`` fails naming it: the process group's own timeout raises
on the rank, and a watchdog in the parent kills every rank when one is stuck past the bound (a backend that
ignores timeouts)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from agents.pipeline.support.collective_rank import COLLECTIVES, CommSettings, measure_rank
from agents.pipeline.support.errors import StageFailed

STARTUP_BOUND_S = 180.0  # spawning ranks and joining the group (imports of torch dominate)


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' busbw factor: the share of the buffer each rank's link carries."""
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    at = (len(ordered) - 1) * q
    lo, hi = math.floor(at), math.ceil(at)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (at - lo)


def merge_ranks(per_rank: list[list[dict[str, Any]]], n: int) -> list[dict[str, Any]]:
    """One row per (op, dtype): ok when every rank matched the reference at every size; an iteration lasts as
    long as its slowest rank; algbw/busbw in GB/s (1e9 bytes) from the mean iteration."""
    out = []
    for i, first in enumerate(per_rank[0]):
        sizes, problems = [], []
        for j, point in enumerate(first["sizes"]):
            points = [rows[i]["sizes"][j] for rows in per_rank]
            problems += [f"rank {r} at {point['bytes']} B: {p['mismatch']}" for r, p in enumerate(points)
                         if p["mismatch"]]
            steps = [max(p["seconds"][k] for p in points) for k in range(min(len(p["seconds"]) for p in points))]
            mean = sum(steps) / len(steps)
            algbw = point["bytes"] / mean / 1e9 if mean > 0 else None
            sizes.append({
                "bytes": point["bytes"], "iters": len(steps),
                "algbw_gbps": algbw, "busbw_gbps": None if algbw is None else algbw * bus_factor(first["op"], n),
                "latency_us": {"p50": _percentile(steps, 0.5) * 1e6, "p99": _percentile(steps, 0.99) * 1e6,
                               "max": max(steps) * 1e6},
            })
        row = {"op": first["op"], "dtype": first["dtype"], "ok": not problems, "sizes": sizes}
        if problems:
            row["mismatches"] = problems[:8]
        out.append(row)
    return out


def _stall_watchdog(progress: Any, started: float, bound: float,
                    startup: float = STARTUP_BOUND_S) -> Callable[[], str | None]:
    def check() -> str | None:
        now = time.time()
        cases = dict(progress)
        if not cases and now - started > startup:
            return f"no rank started measuring within {startup:.0f} s (the process group did not form)"
        for rank, (label, since) in sorted(cases.items()):
            if label != "done" and now - since > bound:
                return f"{label} did not finish within {bound:.0f} s on rank {rank}"
        return None

    return check


def measure(ranks: int, settings: CommSettings, rank_setup: Callable[[int], None] | None = None,
            node: Any = None) -> dict[str, Any]:
    """Run the sweep over ``ranks`` processes; the ``comm`` section (``ranks``, ``collectives``). A collective that
    fails or stalls raises ``StageFailed`` naming it. ``node`` (a ``NodeSpec``): ``ranks`` span the nodes and
    this host runs its share; node 0 merges every rank's measurements, another node returns ``{"ranks",
    "node"}`` once its ranks are done."""
    import torch.multiprocessing as mp

    from agents.runtime.distributed import launch

    sizes = settings.sizes()
    if ranks < 2:
        return {"ranks": ranks, "collectives": [], "notes": ["one rank: the layout uses no collectives"]}
    bound = settings.op_timeout_s + settings.watchdog_grace_s
    # across hosts the rendezvous itself may wait for a late node (and names it when it never comes)
    startup = max(STARTUP_BOUND_S, float(node.timeout) + 60) if node is not None else STARTUP_BOUND_S
    with mp.get_context("spawn").Manager() as manager:
        progress = manager.dict()
        try:
            per_rank = launch(measure_rank, ranks, settings, sizes, progress, rank_setup,
                              pg_timeout=settings.op_timeout_s,
                              watchdog=_stall_watchdog(progress, time.time(), bound, startup), node=node)
        except RuntimeError as exc:
            raise StageFailed(f"collectives over {ranks} ranks: {str(exc).splitlines()[0]}") from exc
    if node is not None and node.node_rank != 0:
        return {"ranks": ranks, "node": node.node_rank, "collectives": []}
    collectives = merge_ranks(per_rank, ranks)
    section: dict[str, Any] = {"ranks": ranks, "collectives": collectives, "settings": asdict(settings)}
    bad = [f"{row['op']} {row['dtype']} ({row['mismatches'][0]})" for row in collectives if not row["ok"]]
    if bad:
        section["error"] = f"collectives differ from the reference: {'; '.join(bad[:4])}"
    return section


def ops_for_layout(tp: int, pp: int, ep: int) -> tuple[str, ...]:
    """The collectives a TP × PP × EP layout runs: TP shards reduce and gather partial results (and the engine
    broadcasts each step); EP dispatches tokens to experts (all-to-all, uneven by routing); PP hands activations
    stage to stage."""
    ops: set[str] = set()
    if tp > 1:
        ops |= {"all_reduce", "all_gather", "reduce_scatter", "broadcast"}
    if ep > 1:
        ops |= {"all_to_all", "all_reduce", "all_gather"}
    if pp > 1:
        ops |= {"send_recv", "broadcast"}
    return tuple(op for op in COLLECTIVES if op in ops)
