"""Running a function on every rank of a world on this machine (``launch``): spawned processes, a rank's failure
named with its traceback, timeouts and a watchdog that end the ranks left waiting."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from agents.runtime.distributed.layout import ParallelState
from agents.runtime.distributed.process_group import destroy_distributed, init_distributed

if TYPE_CHECKING:
    from agents.runtime.nodes import NodeSpec


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
